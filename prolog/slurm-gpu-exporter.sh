#!/bin/sh
# Slurm Prolog (or a prolog.d entry): records the job for slurm-gpu-exporter.
#
# slurmd runs prologs as root with a bare environment (no PATH), so every path
# here is absolute. The install prefix can be changed with
# SLURM_GPU_EXPORTER_PREFIX=... in /etc/default/slurm-gpu-exporter.
# This script always exits 0: a failing prolog would drain the node.
prefix=/opt/slurm-gpu-exporter
defaults=/etc/default/slurm-gpu-exporter
# The same rules as the agent's reader (jobhooks.read_defaults): KEY=VALUE lines,
# blanks and '#' lines skipped, spaces around key and value dropped, then one pair of
# matching quotes ('...' or "...") around the value; nothing is expanded.
if [ -r "$defaults" ]; then
    while IFS= read -r line || [ -n "$line" ]; do
        line=${line#"${line%%[![:space:]]*}"}
        case $line in ''|'#'*) continue ;; esac
        key=${line%%=*}
        [ "$key" = "$line" ] && continue
        key=${key%"${key##*[![:space:]]}"}
        [ "$key" = SLURM_GPU_EXPORTER_PREFIX ] || continue
        value=${line#*=}
        value=${value#"${value%%[![:space:]]*}"}
        value=${value%"${value##*[![:space:]]}"}
        case $value in
            \"*\") value=${value#\"}; value=${value%\"} ;;
            \'*\') value=${value#\'}; value=${value%\'} ;;
        esac
        prefix=$value
    done < "$defaults"
fi
"$prefix/bin/slurm-gpu-exporter-prolog" ||
    echo "slurm-gpu-exporter: prolog helper $prefix/bin/slurm-gpu-exporter-prolog failed (exit $?); job ${SLURM_JOB_ID:-?} is not recorded" >&2
exit 0
