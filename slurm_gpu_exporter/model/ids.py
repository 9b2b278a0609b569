"""Slurm's id grammar: job ids, numbers, SLUIDs, and the forms of a job id each product
takes from outside. The one place every layer and product reads it from.

No import beyond the language itself: the prolog and epilog load it (through
hooks/spool.py) inside slurmd's prolog, where ``re`` alone costs more than their work.
The patterns are for other layers' regular expressions; the checks say the same
without ``re``.
"""

from __future__ import annotations

__all__ = [
    "ARRAY_TASK",
    "JOB_ID_CHARS",
    "JOB_ID_DIGITS",
    "MAX_JOB_ID",
    "NAMED_JOB",
    "NO_VAL",
    "SLUID",
    "SLURM_ID",
    "SLURM_NUM",
    "is_job_id",
    "is_job_target",
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

# The forms of a job id the products take from users and from Slurm's environment:
# each caller takes its own set, named here so that none keeps a pattern of its own.
# A job as users name one: a number of up to 12 digits, an array task (123_4) or a het
# component (123+1): what the proxy's archive endpoint (proxy/archive.py) lets reach
# its database.
NAMED_JOB = r"[1-9][0-9]{0,11}(?:_[0-9]{1,9}|\+[0-9]{1,4})?"
# An array task as users name it, ``A_T``: group 1 the array's id, group 2 the task
# (report/prometheus/array_tasks.py looks its own job id up).
ARRAY_TASK = r"([0-9]{1,12})_([0-9]{1,10})"
# 1-12 decimal digits as ``re``'s ``\d`` reads them (leading zeros and other scripts'
# digits too): slurm-gpu-mail's check of SLURM_JOB_ID (mail/summary.py) before it asks
# the report, which checks the id again.
JOB_ID_DIGITS = r"\d{1,12}"
# Only the characters some form of job id has (ids, ``A_T``, ``J+O``, SLUIDs, steps'
# ``J.S``), any length: the report's check before an id goes into PromQL
# (report/prometheus/queries.py).
JOB_ID_CHARS = r"[A-Za-z0-9_.+-]+"


def is_slurm_id(text: str) -> bool:
    """True when ``text`` is all of ``SLURM_ID``: 1-10 ASCII digits, no leading zero."""
    return 0 < len(text) <= 10 and text.isascii() and text.isdigit() and text[0] != "0"


def is_slurm_num(text: str) -> bool:
    """True when ``text`` is all of ``SLURM_NUM``: ``0`` or a ``SLURM_ID``."""
    return text == "0" or is_slurm_id(text)


def is_job_id(text: str) -> bool:
    """True when ``text`` is a plain Slurm job id: a ``SLURM_ID`` below NO_VAL."""
    return is_slurm_id(text) and int(text) <= MAX_JOB_ID


def is_job_target(text: str) -> bool:
    """True when ``text`` names one job to ``scancel``/``scontrol``: a job id, or an
    array task ``A_T`` whose array is a job id and whose task is ASCII digits."""
    array_job, sep, task = text.partition("_")
    return is_job_id(array_job) and (not sep or (task.isascii() and task.isdigit()))


def is_sluid(text: str) -> bool:
    """True when ``text`` is all of ``SLUID``."""
    return len(text) == 14 and text[0] == "s" and all(c in _CROCKFORD for c in text[1:])
