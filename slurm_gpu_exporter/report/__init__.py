"""slurm-gpu-report: low-utilization and per-job efficiency reports from Prometheus.

It reads only the agent's metrics, through the Prometheus HTTP API (any PromQL
store), with a fixed set of instant queries per report: the number of queries
does not grow with the number of jobs.
"""
