"""Slurm's id grammar and the uid-to-name lookup, shared by the hooks and the node readers.

Standard library only and cheap to import: the prolog and epilog load it through
hooks/spool.py inside slurmd's prolog.
"""

from __future__ import annotations

import pwd

__all__ = [
    "SLURM_ID",
    "SLURM_NUM",
    "is_slurm_id",
    "is_slurm_num",
    "user_name",
]

# Slurm prints uint32 ids with %u: no sign, no leading zero. Job ids are never 0;
# step ids and uids can be. The patterns are for the node readers' regular expressions;
# the checks below say the same without importing ``re`` (the prolog's start-up).
SLURM_ID = r"[1-9][0-9]{0,9}"
SLURM_NUM = r"(?:0|[1-9][0-9]{0,9})"


def is_slurm_id(text: str) -> bool:
    """True when ``text`` is all of ``SLURM_ID``: 1-10 ASCII digits, no leading zero."""
    return 0 < len(text) <= 10 and text.isascii() and text.isdigit() and text[0] != "0"


def is_slurm_num(text: str) -> bool:
    """True when ``text`` is all of ``SLURM_NUM``: ``0`` or a ``SLURM_ID``."""
    return text == "0" or is_slurm_id(text)


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
