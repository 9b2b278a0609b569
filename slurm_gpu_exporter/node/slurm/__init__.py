"""Asking Slurm about jobs (lookup.py: CLI or pyslurm, cache, back-off), parsing what
it prints (parse.py), and the cluster's name in slurm.conf (conf.py)."""
