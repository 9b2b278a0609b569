"""Slurm's id grammar and the uid-to-name lookup, shared by the hooks and the node readers.

Standard library only and cheap to import: the prolog and epilog load it through
hooks/spool.py inside slurmd's prolog.
"""

from __future__ import annotations

import pwd
import re

__all__ = [
    "JOB_ID_RE",
    "SLURM_ID",
    "SLURM_NUM",
    "STEP_ID_RE",
    "user_name",
]

# Slurm prints uint32 ids with %u: no sign, no leading zero. Job ids are never 0;
# step ids and uids can be.
SLURM_ID = r"[1-9][0-9]{0,9}"
SLURM_NUM = r"(?:0|[1-9][0-9]{0,9})"
JOB_ID_RE = re.compile(SLURM_ID)
STEP_ID_RE = re.compile(SLURM_NUM)


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
