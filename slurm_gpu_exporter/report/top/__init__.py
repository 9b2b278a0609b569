"""``slurm-gpu-report top JOBID``: one running job, live, from its latest samples."""
