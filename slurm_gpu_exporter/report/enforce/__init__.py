"""``slurm-gpu-report enforce``: the policy, idle windows and their queries, decisions,
the state file, the run and its output."""
