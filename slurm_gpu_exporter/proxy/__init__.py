"""slurm-gpu-proxy: a PromQL-enforcing access proxy in front of a Prometheus HTTP API.

Users see only the series labelled with their own ``user`` (coordinators: their
accounts' users), admins see everything. It knows the agent's world only through
metric names and the web config format (docs/proxy.md).
"""
