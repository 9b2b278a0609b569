"""GPU use given to jobs: which job holds which GPU or MIG instance, its share of
busy time, memory, energy, activity, throttling and errors, and the counters kept
across samples and restarts."""
