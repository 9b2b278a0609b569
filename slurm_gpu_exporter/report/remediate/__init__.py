"""``slurm-gpu-report remediate``: the Alertmanager webhook that drains nodes whose GPU
failed."""
