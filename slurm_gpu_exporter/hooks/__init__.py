"""What runs inside slurmd's prolog and epilog: the job hooks, the spool record format and
Slurm's id grammar. Standard library only (tests/test_layout.py checks it)."""
