"""The one way text from outside (job, user, account and node names, alert labels, and
messages quoting them) is made inert for one line: a mail header or subject, a Slurm
command's argument, a log line.

``plain`` is what every such line goes through, in ``enforce``, ``notify`` and
``remediate`` alike: control characters (CR and LF among them, terminal escapes,
bidi overrides) become U+FFFD, so text cannot start a new header, a new log line or
a second command. ``slurm_value`` is ``plain`` narrowed to the characters Slurm keeps
in a reason or comment. The renderers (``render/inert.py``) build on ``plain``.
"""

from __future__ import annotations

import re

__all__ = ["plain", "slurm_value"]

# C0 and C1 controls, DEL, line/paragraph separators and the bidi controls that can
# make text read differently from what it is ("Trojan Source").
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# What Slurm keeps in a reason or comment: no quotes, no newlines, bounded length.
_SLURM_UNSAFE = re.compile(r"[^A-Za-z0-9 ._:,;/()%=+@-]")


def plain(text: object, limit: int | None = None) -> str:
    """``text`` with every control character replaced by U+FFFD, cut to ``limit``."""
    out = _CONTROLS.sub("\ufffd", str(text))
    return out if limit is None else out[:limit]


def slurm_value(text: object, limit: int = 200) -> str:
    """Text for a Slurm reason or comment: any other character than a few safe ones
    becomes ``_``."""
    return _SLURM_UNSAFE.sub("_", plain(text))[:limit]
