"""User names as the products take them from outside: one grammar, two sets. Standard
library only, no I/O (the uid-to-name lookup is hooks/ids.py's, and the proxy's own).

Both sets start with a letter, digit or ``_`` (never ``-``, so no name reads as an
option) and hold none of the characters that could make one name stand for more.
"""

from __future__ import annotations

import re

__all__ = ["MAILABLE_USER", "USER_NAME", "is_mailable_user", "is_user_name"]

# Names a caller of the proxy can have: Unix and Slurm user names, Grafana logins
# (e-mail style, hence ``@`` and ``+``).
USER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._@+-]{0,127}")
# A user name that can stand in a mail address: POSIX's portable name characters.
# Anything else (commas, spaces, angle brackets, quotes, "@") could name more or other
# recipients, so such a user is not written to.
MAILABLE_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")


def is_user_name(text: str) -> bool:
    """True when ``text`` is all of ``USER_NAME``."""
    return USER_NAME.fullmatch(text) is not None


def is_mailable_user(text: str) -> bool:
    """True when ``text`` is all of ``MAILABLE_USER``: it may stand in a mail address."""
    return MAILABLE_USER.fullmatch(text) is not None
