"""slurm-gpu-report: efficiency reports of Slurm GPU jobs from Prometheus (``job``,
``low-util``), the job archive (``archive``, ``usage``), enforcement of idle GPUs
(``enforce``) and remediation of GPU faults (``remediate``).

It reads only the agent's metrics, through the Prometheus HTTP API (any PromQL
store), with a fixed set of queries per report: the number of queries does not grow
with the number of jobs. Each folder is a layer (docs/layout.md): ``figures`` →
``prometheus``, ``slurm``, ``render`` → ``notify`` → ``archive``, ``enforce``,
``remediate`` → ``cli``.
"""
