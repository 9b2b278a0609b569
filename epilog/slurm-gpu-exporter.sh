#!/bin/sh
# Slurm Epilog (or an epilog.d entry): marks the job ended for slurm-gpu-exporter.
#
# slurmd runs epilogs as root with a bare environment (no PATH), so every path
# here is absolute. The install prefix can be changed with
# SLURM_GPU_EXPORTER_PREFIX=... in /etc/default/slurm-gpu-exporter.
# This script always exits 0: a failing epilog would drain the node.
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
# The venv's interpreter runs the entry point itself, started with -I -S: no PYTHON*
# variables, no current directory on sys.path and no site (site-packages is added by
# hand; a layout where that finds nothing, such as an editable install, runs site after
# all). A prefix without bin/python runs the console script.
run='import sys
prefix, kind = sys.argv.pop(1), sys.argv.pop(1)
sys.path.append("%s/%s/python%d.%d/site-packages" % (prefix, sys.platlibdir, *sys.version_info[:2]))
try:
    from slurm_gpu_exporter.hooks import jobhooks
except ImportError:
    import site
    site.main()
    from slurm_gpu_exporter.hooks import jobhooks
sys.exit(getattr(jobhooks, kind + "_main")())'
if [ -x "$prefix/bin/python" ]; then
    "$prefix/bin/python" -I -S -c "$run" "$prefix" epilog
else
    "$prefix/bin/slurm-gpu-exporter-epilog"
fi ||
    echo "slurm-gpu-exporter: epilog helper $prefix/bin/slurm-gpu-exporter-epilog failed (exit $?); job ${SLURM_JOB_ID:-?} is not marked ended" >&2
exit 0
