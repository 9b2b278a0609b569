"""The optional parts of an install (pip extras) and how to tell that one is missing.

The job archive's libraries (SQLAlchemy, psycopg) come with the ``archive`` extra: a
plain ``pip install slurm-gpu-exporter`` runs every command without them, and the ones
that need them (the report's archive commands, the proxy's ``--archive.url``) import
them inside a check that turns their absence into one line saying what to install.
Standard library only, no I/O: both products use it.
"""

from __future__ import annotations

import sys

__all__ = ["ARCHIVE_LIBRARIES", "archive_install_hint", "missing_archive_library"]

# The top-level modules the archive extra installs (greenlet comes with SQLAlchemy).
ARCHIVE_LIBRARIES = frozenset({"sqlalchemy", "psycopg", "psycopg_binary", "greenlet"})


def archive_install_hint() -> str:
    """The pip command that adds the archive to this program's own environment."""
    return f"{sys.prefix}/bin/pip install 'slurm-gpu-exporter[archive]'"


def missing_archive_library(exc: ModuleNotFoundError) -> str | None:
    """The archive library whose absence ``exc`` reports, or None when the missing module
    is another one (a bug, to be raised as it is)."""
    library = (exc.name or "").split(".")[0]
    return library if library in ARCHIVE_LIBRARIES else None
