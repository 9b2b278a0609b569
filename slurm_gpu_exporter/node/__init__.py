"""Readers of what the node holds: kernel files, /proc, cgroups, the spool directory, the
state directory and Slurm's answers; each counts its own errors (source_health.py).
Nothing here decides about jobs or GPUs."""
