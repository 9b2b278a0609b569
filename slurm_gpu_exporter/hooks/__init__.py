"""What runs inside slurmd's prolog and epilog: the job hooks, the spool record format and
Slurm's id grammar. Standard library only (tests/unit/test_layout.py checks it)."""
