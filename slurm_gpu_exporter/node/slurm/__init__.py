"""Asking Slurm about jobs (lookup.py: CLI or pyslurm, cache, back-off) and parsing what
it prints (parse.py)."""
