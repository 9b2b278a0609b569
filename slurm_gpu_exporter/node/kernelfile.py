"""The one reader of small kernel files (cgroupfs, procfs) every node-side reader uses."""

from __future__ import annotations

import os

__all__ = ["read_kernel_file"]

_READ_CHUNK = 65536


def read_kernel_file(path: str | os.PathLike[str]) -> bytes:
    """All of a small cgroupfs or procfs file, through one descriptor; raises OSError.

    Such files report size 0, so a single sized read cannot be used. They are filled
    by the kernel as far as a read allows (seq_files), so a read shorter than the
    buffer is the end and the usual second, empty read is saved: this runs for every
    job's cgroup files and every GPU process's stat on every sample.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, _READ_CHUNK)
        if len(data) < _READ_CHUNK:
            return data
        chunks = [data]
        while chunk := os.read(fd, _READ_CHUNK):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)
