"""A user's PromQL query: its limits on the raw text, its parse and restriction to the
user's own jobs in worker processes with a hard time limit, and printing it back."""
