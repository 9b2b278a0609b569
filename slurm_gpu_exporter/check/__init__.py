"""``slurm-gpu-exporter check``: what the agent sees on this node and what stands
between it and right numbers (docs/check.md)."""
