"""``slurm-gpu-report``'s command line: the subcommands and their flags, what each does,
and the entry point (``main``); the only layer that wires the others together."""
