"""``slurm-gpu-mail``: slurm.conf's MailProg, which adds a job's GPU efficiency summary
to Slurm's end-of-job mail and hands it to the site's mailer (docs/users.md)."""
