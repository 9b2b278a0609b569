"""The grammar of Slurm's cgroup paths: which job and step a cgroup path points at.

Pure string parsing, no I/O (the layouts are described in fs.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurm_gpu_exporter.model.ids import SLUID, SLURM_ID, SLURM_NUM

__all__ = ["CgroupJobRef", "SlurmRoot", "job_dir_key", "job_under_roots", "parse_cgroup_path"]

V1_TOP_RE = re.compile(r"slurm(?:_.+)?")
UID_RE = re.compile(rf"uid_({SLURM_NUM})")  # root's jobs run as uid_0
JOB_RE = re.compile(rf"job_({SLURM_ID})")
SLUID_RE = re.compile(SLUID)
SCOPE_RE = re.compile(r"(?:.+_)?slurmstepd\.scope")
# step_<n>, step_<n>+<het component>, or one of Slurm's named steps.
STEP_RE = re.compile(rf"step_({SLURM_NUM}(?:\+{SLURM_NUM})?|batch|extern|interactive)")


@dataclass(frozen=True)
class CgroupJobRef:
    """Where in a Slurm job a cgroup path points.

    ``job_key`` is the numeric job id, or the SLUID when the layout names job
    directories by SLUID (``is_sluid``). ``step`` is ``"0"``, ``"batch"``,
    ``"extern"``, ``"interactive"``, ``"0+1"``..., or None for the job level.
    ``uid`` comes from v1 paths (``uid_<uid>``); v2 paths do not carry it.
    """

    job_key: str
    step: str | None
    uid: int | None
    is_sluid: bool


@dataclass(frozen=True)
class SlurmRoot:
    """One Slurm tree root the cgroup layer found, as /proc/<pid>/cgroup names it.

    ``path`` is relative to its hierarchy (``/slurm_node1``,
    ``/system.slice/slurmstepd.scope``); ``controllers`` are the v1 controllers of
    the hierarchy it is in, or empty for the v2 unified tree.
    """

    controllers: frozenset[str]
    path: str


def job_under_roots(controllers: str, path: str, roots: tuple[SlurmRoot, ...]
                    ) -> CgroupJobRef | None:
    """The job of one /proc/<pid>/cgroup line (``controllers``, ``path``), or None.

    Only a path below one of ``roots`` in the same hierarchy names a job: a user
    with a delegated subtree (``user@UID.service``, the ``name=systemd`` tree) can
    make a look-alike ``slurmstepd.scope/job_<id>`` anywhere else, and that is no job.
    """
    line_controllers = frozenset(c for c in controllers.split(",") if c)
    for root in roots:
        if line_controllers != root.controllers and not (line_controllers & root.controllers):
            continue  # another hierarchy (an empty set only matches the v2 tree)
        if not path.startswith(root.path + "/"):
            continue
        raw = path[len(root.path) + 1 :].split("/")
        if "." in raw or ".." in raw:
            return None
        parts = [p for p in raw if p]
        return _parse_v1_tail(parts) if root.controllers else _parse_v2_tail(parts)
    return None


def parse_cgroup_path(path: str) -> CgroupJobRef | None:
    """Map a cgroup path, as written in /proc/<pid>/cgroup, to the Slurm job it is in.

    Grammar only: it does not know where Slurm's roots are, so it is no proof that a
    process is in a job (``job_under_roots`` is). Returns None for any cgroup outside
    a Slurm job (system services, the ``system`` leaves, user sessions) and for
    look-alikes such as ``job_12abc``, ``step_foo`` or paths with ``.``/``..``
    components.
    """
    raw = path.split("/")
    if "." in raw or ".." in raw:
        return None
    parts = [p for p in raw if p]
    for i, name in enumerate(parts):
        if SCOPE_RE.fullmatch(name):
            ref = _parse_v2_tail(parts[i + 1 :])
        elif V1_TOP_RE.fullmatch(name):
            ref = _parse_v1_tail(parts[i + 1 :])
        else:
            continue
        if ref is not None:
            return ref
    return None


def _parse_step(parts: list[str]) -> tuple[bool, str | None]:
    """(valid, step name) for what follows a job directory; anything below a step is the step's."""
    if not parts:
        return True, None
    m = STEP_RE.fullmatch(parts[0])
    if m is None:
        return False, None
    return True, m.group(1)


def _parse_v1_tail(parts: list[str]) -> CgroupJobRef | None:
    if len(parts) < 2:
        return None
    uid_m = UID_RE.fullmatch(parts[0])
    job_m = JOB_RE.fullmatch(parts[1])
    if uid_m is None or job_m is None:
        return None
    ok, step = _parse_step(parts[2:])
    if not ok:
        return None
    return CgroupJobRef(job_key=job_m.group(1), step=step, uid=int(uid_m.group(1)), is_sluid=False)


def job_dir_key(name: str) -> tuple[str, bool] | None:
    """(job_key, is_sluid) for a v2 job directory name, None for anything else."""
    m = JOB_RE.fullmatch(name)
    if m is not None:
        return m.group(1), False
    if SLUID_RE.fullmatch(name):
        return name, True
    return None


def _parse_v2_tail(parts: list[str]) -> CgroupJobRef | None:
    if not parts:
        return None
    key = job_dir_key(parts[0])
    if key is None:
        return None
    ok, step = _parse_step(parts[1:])
    if not ok:
        return None
    return CgroupJobRef(job_key=key[0], step=step, uid=None, is_sluid=key[1])
