"""slurm-gpu-exporter-prolog and slurm-gpu-exporter-epilog.

slurmd runs these (through prolog/ and epilog/slurm-gpu-exporter.sh) as root,
with a bare environment holding only SLURM_* and GPU variables. They must
finish fast and exit 0 whatever happens, because a failing prolog drains the
node: every problem becomes one line on stderr, which slurmd logs. They never
talk to the agent, so a down or hung agent cannot delay a job.

Standard library only, and as little of it as the job needs: the modules below, which
import no ``re``, ``json`` or ``dataclasses`` (tests/hooks/test_jobhooks.py holds the
list). prolog/ and epilog/slurm-gpu-exporter.sh start the interpreter with ``-I -S``.
"""

from __future__ import annotations

import os
import sys
import time

from slurm_gpu_exporter.hooks import spool
from slurm_gpu_exporter.hooks.ids import user_name
from slurm_gpu_exporter.model.ids import is_job_id

# Names for annotations only: importing collections.abc would cost the prolog
# ``collections`` at every start.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

DEFAULTS_FILE = "/etc/default/slurm-gpu-exporter"
SPOOL_DIR_KEY = "SLURM_GPU_EXPORTER_SPOOL_DIR"

# Record field -> environment variables slurmd may set, first found wins.
_ENV_FIELDS: dict[str, tuple[str, ...]] = {
    "user": ("SLURM_JOB_USER",),
    "account": ("SLURM_JOB_ACCOUNT",),
    "partition": ("SLURM_JOB_PARTITION",),
    "qos": ("SLURM_JOB_QOS",),
    "cluster": ("SLURM_CLUSTER_NAME",),
    "node": ("SLURMD_NODENAME",),
    "job_gpus": ("SLURM_JOB_GPUS",),
    "cuda_visible_devices": ("CUDA_VISIBLE_DEVICES",),
    "gpu_device_ordinal": ("GPU_DEVICE_ORDINAL",),
    "array_job_id": ("SLURM_ARRAY_JOB_ID",),
    "array_task_id": ("SLURM_ARRAY_TASK_ID",),
    "sluid": ("SLURM_JOB_SLUID",),
}


def clean_text(value: str) -> str:
    """Make an environment value safe to store and to use as a label value.

    os.environ keeps undecodable bytes as surrogates and may hold control
    characters; both are replaced, and the value is cut to a sane length.
    """
    text = value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    text = "".join(ch if ch.isprintable() else "\ufffd" for ch in text)
    return text[: spool.MAX_FIELD_CHARS]


def read_defaults(path: str = DEFAULTS_FILE) -> dict[str, str]:
    """KEY=VALUE lines of the defaults file, no expansion.

    The prolog/epilog shell scripts read the file by the same rules: blank and ``#``
    lines skipped, spaces around key and value dropped, then one pair of matching
    quotes (``'...'`` or ``"..."``) around the value.
    """
    values: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read(64 * 1024).splitlines()
    except OSError:
        return values
    for line in lines:
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            values[key.strip()] = unquote(value.strip())
    return values


def unquote(value: str) -> str:
    """One pair of matching quotes around ``value`` removed; anything else kept as it is."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def record_from_env(env: Mapping[str, str], now: float, *, started: bool) -> spool.JobRecord:
    """Build a job record from slurmd's prolog/epilog environment.

    Raises SpoolError when the job id or uid is missing or not plausible.
    """
    jobid = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    if not is_job_id(jobid):
        raise spool.SpoolError(f"refusing job id {clean_text(jobid)[:40]!r}: "
                               "SLURM_JOB_ID is not a Slurm job id")
    raw_uid = env.get("SLURM_JOB_UID", "")
    if not raw_uid.isdigit() or int(raw_uid) >= 2**32:
        raise spool.SpoolError(f"job {jobid}: SLURM_JOB_UID {clean_text(raw_uid)[:40]!r} "
                               "is not a uid")
    fields = {}
    for field, names in _ENV_FIELDS.items():
        value = next((env[name] for name in names if env.get(name)), "")
        fields[field] = clean_text(value)
    if not fields["user"]:
        fields["user"] = _user_name(int(raw_uid))
    return spool.JobRecord(
        jobid=jobid,
        uid=int(raw_uid),
        start_time=now if started else None,
        end_time=None if started else now,
        **fields,
    )


def _user_name(uid: int) -> str:
    """Only asked when slurmd did not pass SLURM_JOB_USER."""
    name = user_name(uid)
    return clean_text(name) if name else ""


def spool_dir_from(argv: Sequence[str], env: Mapping[str, str],
                   defaults: Mapping[str, str]) -> str:
    """--spool-dir DIR / --spool-dir=DIR, else $SLURM_GPU_EXPORTER_SPOOL_DIR (never set by
    slurmd; for runs by hand), else the defaults file, else the built-in default."""
    for i, arg in enumerate(argv):
        if arg == "--spool-dir" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--spool-dir="):
            return arg.split("=", 1)[1]
    return env.get(SPOOL_DIR_KEY) or defaults.get(SPOOL_DIR_KEY) or spool.DEFAULT_SPOOL_DIR


def run_prolog(env: Mapping[str, str], spool_dir: str, now: float) -> None:
    """Write the job's record; raises SpoolError or OSError on failure."""
    record = record_from_env(env, now, started=True)
    dir_fd = spool.open_spool_dir(spool_dir, create=True)
    try:
        spool.write_record(dir_fd, record)
    finally:
        os.close(dir_fd)


def run_epilog(env: Mapping[str, str], spool_dir: str, now: float) -> None:
    """Mark the job's record ended, writing one from the environment if the prolog left none."""
    from_env = record_from_env(env, now, started=False)
    dir_fd = spool.open_spool_dir(spool_dir, create=True)
    try:
        existing = spool.read_record_quietly(dir_fd, from_env.jobid)
        spool.write_record(dir_fd, existing.ended(now) if existing else from_env)
    finally:
        os.close(dir_fd)


def _main(kind: str, action: Callable[[Mapping[str, str], str, float], None]) -> int:
    argv = sys.argv[1:]
    if argv and argv[0] in ("-h", "--help"):
        print(f"usage: slurm-gpu-exporter-{kind} [--spool-dir DIR]\n"
              f"Run by slurmd as the {kind.capitalize()}; see prolog/ and epilog/ scripts.")
        return 0
    try:
        spool_dir = spool_dir_from(argv, os.environ, read_defaults())
        action(os.environ, spool_dir, time.time())
    except BaseException as exc:  # never let slurmd see a failure: it would drain the node
        _complain(kind, exc)
    return 0


def _complain(kind: str, exc: BaseException) -> None:
    jobid = clean_text(os.environ.get("SLURM_JOB_ID", "?"))[:40]
    what = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or repr(exc)
    where = f" ({exc.filename})" if isinstance(exc, OSError) and exc.filename else ""
    try:
        print(f"slurm-gpu-exporter-{kind}: job {jobid}: {what}{where}; "
              "GPU metrics for this job may be incomplete", file=sys.stderr)
    except OSError:
        pass


def prolog_main() -> int:
    """Entry point of slurm-gpu-exporter-prolog."""
    return _main("prolog", run_prolog)


def epilog_main() -> int:
    """Entry point of slurm-gpu-exporter-epilog."""
    return _main("epilog", run_epilog)
