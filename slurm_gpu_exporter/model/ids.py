"""Slurm's id grammar: job ids, numbers, SLUIDs. The one place every layer reads it from.

No import beyond the language itself: the prolog and epilog load it (through
hooks/spool.py) inside slurmd's prolog, where ``re`` alone costs more than their work.
The patterns are for other layers' regular expressions; the checks say the same
without ``re``.
"""

from __future__ import annotations

__all__ = [
    "MAX_JOB_ID",
    "NO_VAL",
    "SLUID",
    "SLURM_ID",
    "SLURM_NUM",
    "is_job_id",
    "is_sluid",
    "is_slurm_id",
    "is_slurm_num",
]

# Slurm prints uint32 ids with %u: no sign, no leading zero. Job ids are never 0;
# step ids, array task ids, het offsets and uids can be.
SLURM_ID = r"[1-9][0-9]{0,9}"
SLURM_NUM = r"(?:0|[1-9][0-9]{0,9})"
# Slurm 26.05's canonical printed SLUID: "s" and 13 upper-case Crockford base32 digits
# (no I, L, O, U), e.g. sEKNKTV3WPV500.
SLUID = r"s[0-9A-HJKMNP-TV-Z]{13}"
_CROCKFORD = frozenset("0123456789ABCDEFGHJKMNPQRSTVWXYZ")
# NO_VAL (0xfffffffe) is Slurm's "not set" for a uint32; 0xffffffff is INFINITE.
NO_VAL = 0xFFFFFFFE
MAX_JOB_ID = 0xFFFFFFFD


def is_slurm_id(text: str) -> bool:
    """True when ``text`` is all of ``SLURM_ID``: 1-10 ASCII digits, no leading zero."""
    return 0 < len(text) <= 10 and text.isascii() and text.isdigit() and text[0] != "0"


def is_slurm_num(text: str) -> bool:
    """True when ``text`` is all of ``SLURM_NUM``: ``0`` or a ``SLURM_ID``."""
    return text == "0" or is_slurm_id(text)


def is_job_id(text: str) -> bool:
    """True when ``text`` is a plain Slurm job id: a ``SLURM_ID`` below NO_VAL."""
    return is_slurm_id(text) and int(text) <= MAX_JOB_ID


def is_sluid(text: str) -> bool:
    """True when ``text`` is all of ``SLUID``."""
    return len(text) == 14 and text[0] == "s" and all(c in _CROCKFORD for c in text[1:])
