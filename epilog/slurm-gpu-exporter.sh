#!/bin/sh
# Slurm Epilog (or an epilog.d entry): marks the job ended for slurm-gpu-exporter.
#
# slurmd runs epilogs as root with a bare environment (no PATH), so every path
# here is absolute. The install prefix can be changed with
# SLURM_GPU_EXPORTER_PREFIX=... in /etc/default/slurm-gpu-exporter.
# This script always exits 0: a failing epilog would drain the node.
prefix=/opt/slurm-gpu-exporter
if [ -r /etc/default/slurm-gpu-exporter ]; then
    while IFS='=' read -r key value; do
        [ "$key" = SLURM_GPU_EXPORTER_PREFIX ] && prefix=${value%\"} && prefix=${prefix#\"}
    done < /etc/default/slurm-gpu-exporter
fi
"$prefix/bin/slurm-gpu-exporter-epilog" ||
    echo "slurm-gpu-exporter: epilog helper $prefix/bin/slurm-gpu-exporter-epilog failed (exit $?); job ${SLURM_JOB_ID:-?} is not marked ended" >&2
exit 0
