"""The sample loop: one sample of every source, timed, saved and published."""
