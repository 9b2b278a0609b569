"""The one reader of small kernel files (cgroupfs, procfs) every node-side reader uses,
and the files the sampler keeps open to read them again cheaply."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

__all__ = ["HeldFiles", "read_kernel_file"]

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


# Filesystems whose files the kernel fills on each read: a file of these kept open and
# read again from offset 0 gives its current content. A regular file does not (a writer
# that replaces it leaves the open descriptor on the old one), so it is never held.
_KERNEL_FS = frozenset({"cgroup", "cgroup2", "proc", "sysfs"})


class HeldFiles:
    """Small kernel files kept open between samples and read again with one ``pread``.

    Opening a cgroup file is most of what reading it costs (the path walk): about 10 us
    against 1 us for a ``pread`` of an open one, for each of a job's half dozen files on
    every sample. A file whose cgroup was removed fails its read (ENODEV); it is then
    closed and opened afresh once, which also finds a cgroup made again at the same
    path (a requeued job). At most ``limit`` files are held, so that the agent's HTTP
    connections keep their room under the file limit; past it, files are read with
    open/read/close as before. Only files on cgroupfs, procfs and sysfs are held. Not
    thread-safe: the sampler thread owns it (through CgroupFS).

    Only for files that are never empty (a number, a table of them): the kernel starts
    a file again from its first line when a read at offset 0 follows a read that ended
    elsewhere, and a file last read as empty ends at 0. ``cgroup.procs`` (which may be
    empty) is the exception, with a rule of its own: v1 keeps the pid list an open one
    loaded, for every reader of that cgroup, until no read has used it for a second
    (CGROUP_PIDLIST_DESTROY_DELAY), and a read from an open file within that time gets
    that list, while a fresh open loads a new one. A held ``cgroup.procs`` is therefore
    read with ``pread`` only when its last read is ``PID_LIST_FRESH_S`` old (samples
    seconds apart); one read sooner (short sample intervals, a step walked twice) is
    opened afresh. tests/node/test_held_files.py checks both on a real cgroup.
    """

    PID_LIST = "/cgroup.procs"
    PID_LIST_FRESH_S = 3.0  # three times the kernel's delay: its work queue may lag

    def __init__(self, limit: int, mountinfo: str = "/proc/self/mountinfo",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._mountinfo = mountinfo
        self._clock = clock  # real time: the kernel's delay is
        self._fds: dict[str, int] = {}
        self._pid_lists_read: dict[str, float] = {}  # held cgroup.procs -> its last read
        self._kernel_dev: dict[int, bool] = {}  # st_dev -> on a kernel filesystem

    def __len__(self) -> int:
        return len(self._fds)

    def __iter__(self) -> Iterator[str]:
        """The paths held open."""
        return iter(list(self._fds))

    def read(self, path: str) -> bytes:
        """The file's current content; raises OSError as ``read_kernel_file`` does."""
        fd = self._fds.get(path)
        if path.endswith(self.PID_LIST):
            now = self._clock()
            last = self._pid_lists_read.get(path)
            if fd is not None and last is not None and now - last < self.PID_LIST_FRESH_S:
                try:
                    data = read_kernel_file(path)  # the held one would read the kept list
                except OSError:
                    self._close(path)  # the cgroup went: so does the held file
                    raise
                self._pid_lists_read[path] = now
                return data
            data = self._read(path, fd)
            if path in self._fds:
                self._pid_lists_read[path] = now
            return data
        return self._read(path, fd)

    def _read(self, path: str, fd: int | None) -> bytes:
        if fd is not None:
            try:
                data = os.pread(fd, _READ_CHUNK, 0)
            except OSError:
                self._close(path)  # removed (or its process gone): open it afresh
            else:
                if len(data) < _READ_CHUNK:
                    return data
                self._close(path)  # grew past one read: not a file to hold
                return read_kernel_file(path)
        if len(self._fds) >= self.limit:
            return read_kernel_file(path)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.pread(fd, _READ_CHUNK, 0)
            if len(data) < _READ_CHUNK:  # all of it: kept open where the kernel fills it
                if self._on_kernel_fs(fd):
                    self._fds[path] = fd
                    fd = -1
                return data
        finally:
            if fd >= 0:
                os.close(fd)
        return read_kernel_file(path)  # longer than one read: never held

    def keep_only(self, alive: Callable[[str], bool]) -> None:
        """Close the files for whose path ``alive`` says False (a job that is gone)."""
        for path in [p for p in self._fds if not alive(p)]:
            self._close(path)

    def close(self) -> None:
        for path in list(self._fds):
            self._close(path)

    def _close(self, path: str) -> None:
        self._pid_lists_read.pop(path, None)
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def _on_kernel_fs(self, fd: int) -> bool:
        dev = os.fstat(fd).st_dev
        known = self._kernel_dev.get(dev)
        if known is None:
            known = self._kernel_dev[dev] = _fs_type(self._mountinfo, dev) in _KERNEL_FS
        return known


def _fs_type(mountinfo: str, dev: int) -> str:
    """The type of the filesystem mounted with device number ``dev`` ("" if not found)."""
    wanted = f"{os.major(dev)}:{os.minor(dev)}"
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                fields = line.split()
                if len(fields) > 2 and fields[2] == wanted and " - " in line:
                    return line.split(" - ", 1)[1].split()[0]
    except OSError:
        pass
    return ""
