"""Writing a file that holds users' data (enforce's memory, the notify state): owner-only
whatever the umask, and whole or not at all.

The new content goes to a temporary file made afresh (``O_EXCL|O_NOFOLLOW``) through a
descriptor of the directory, set to mode 0600 with ``fchmod`` (a umask can only take
bits away, and 0600 is what is meant), fsynced, renamed over the old file, and the
directory fsynced: a planted link is never followed and a crash leaves the old file or
the new one.
"""

from __future__ import annotations

import os
from pathlib import Path

from slurm_gpu_exporter.report.errors import ReportError

FILE_MODE = 0o600


def write_private(path: Path, body: bytes, what: str, exit_code: int = 2,
                  mode: int = FILE_MODE) -> None:
    """Replace ``path`` with ``body``; ReportError naming ``what`` ("the enforce state").
    ``mode`` widens 0600 where a group must read the file (the admins' review: 0640)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        dirfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise ReportError(f"cannot write {what} in {path.parent}: {exc.strerror}",
                          exit_code) from None
    tmp = f".{path.name}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode,
                     dir_fd=dirfd)
        try:
            os.fchmod(fd, mode)
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path.name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
        os.fsync(dirfd)
    except OSError as exc:
        try:
            os.unlink(tmp, dir_fd=dirfd)
        except OSError:
            pass
        raise ReportError(f"cannot write {what} {path}: {exc.strerror}", exit_code) from None
    finally:
        os.close(dirfd)
