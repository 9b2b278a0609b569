"""Small pieces every node-side reader shares: the kernel file reader, Slurm's id
grammar and the uid-to-name lookup.

Standard library only and cheap to import: the prolog and epilog load it through
spool.py inside slurmd's prolog.
"""

from __future__ import annotations

import os
import pwd
import re

__all__ = [
    "JOB_ID_RE",
    "SLURM_ID",
    "SLURM_NUM",
    "STEP_ID_RE",
    "read_kernel_file",
    "user_name",
]

# Slurm prints uint32 ids with %u: no sign, no leading zero. Job ids are never 0;
# step ids and uids can be.
SLURM_ID = r"[1-9][0-9]{0,9}"
SLURM_NUM = r"(?:0|[1-9][0-9]{0,9})"
JOB_ID_RE = re.compile(SLURM_ID)
STEP_ID_RE = re.compile(SLURM_NUM)


_READ_CHUNK = 65536


def read_kernel_file(path: str | os.PathLike[str]) -> bytes:
    """All of a small cgroupfs or procfs file, through one descriptor; raises OSError.

    Such files report size 0, so a single sized read cannot be used. They are filled
    by the kernel as far as a read allows (seq_files), so a read shorter than the
    buffer is the end and the usual second, empty read is saved: this runs for every
    job's cgroup files and every GPU process's stat on every sample.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, _READ_CHUNK)
        if len(data) < _READ_CHUNK:
            return data
        chunks = [data]
        while chunk := os.read(fd, _READ_CHUNK):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


# Names found so far. A uid the user database does not know is not remembered: a
# directory service may learn it a moment later.
_user_names: dict[int, str] = {}


def user_name(uid: int) -> str | None:
    """The login name of ``uid``, or None when the user database does not know it."""
    name = _user_names.get(uid)
    if name is None:
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            return None
        if len(_user_names) >= 4096:  # bound memory on nodes that see many users
            _user_names.clear()
        _user_names[uid] = name
    return name
