"""The uid-to-name lookup, shared by the hooks and the node readers (Slurm's id
grammar is model/ids.py).

Standard library only and cheap to import: the prolog and epilog load it through
hooks/spool.py inside slurmd's prolog.
"""

from __future__ import annotations

import pwd

__all__ = ["user_name"]


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
