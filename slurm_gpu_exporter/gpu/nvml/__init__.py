"""The NVML backend: the real driver through nvidia-ml-py, its fields, health
counters, sample buffers and GPM metrics."""
