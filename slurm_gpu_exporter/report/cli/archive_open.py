"""The one door from the commands to the job archive, which is an optional part.

The archive's libraries (SQLAlchemy, and psycopg for PostgreSQL) come with the
``archive`` extra. GPU and login nodes run ``job``, ``low-util``, ``enforce`` and
``remediate`` without them, so nothing outside the archive modules imports them at
load time; a command that needs the archive imports it inside this guard and, where
the libraries are missing, says in one line what to install (exit 2, no traceback).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from slurm_gpu_exporter.model.extras import archive_install_hint, missing_archive_library
from slurm_gpu_exporter.report.errors import ReportError

EXIT_ARCHIVE_NOT_INSTALLED = 2


@contextmanager
def archive_libraries(what: str) -> Iterator[None]:
    """Run the body; a missing archive library becomes a one-line ReportError naming
    ``what`` needed it and the extra to install. Any other missing module is a bug and
    is raised as it is."""
    try:
        yield
    except ModuleNotFoundError as exc:
        library = missing_archive_library(exc)
        if library is None:
            raise
        raise ReportError(f"{what} needs the job archive's libraries, which are not "
                          f"installed (no module {library!r}): {archive_install_hint()}",
                          EXIT_ARCHIVE_NOT_INSTALLED) from None
