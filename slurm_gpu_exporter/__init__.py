"""slurm-gpu-exporter: per-job GPU usage on Slurm nodes, for Prometheus.

This package's top level imports the standard library only: the prolog and
epilog entry points run inside slurmd's prolog and must start fast.
"""

__version__ = "0.1.0"
