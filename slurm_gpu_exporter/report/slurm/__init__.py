"""What the central side asks Slurm (``accounting``: sacct) and the one module that acts
on Slurm (``actions``: squeue, scancel, scontrol update)."""
