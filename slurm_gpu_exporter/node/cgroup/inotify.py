"""Linux inotify through ctypes over libc: the three calls the cgroup watch needs.

Not ``inotify_simple``: its first ``INotify()`` runs ``ctypes.util.find_library("c")``,
which on Linux starts ``/sbin/ldconfig -p`` as a child process; the symbols are
looked up here in the running interpreter's own libc (``dlsym`` on the program).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import weakref
from collections.abc import Callable

__all__ = ["IN_CREATE", "IN_DELETE", "IN_DELETE_SELF", "IN_IGNORED", "IN_MOVED_FROM",
           "IN_MOVED_TO", "IN_MOVE_SELF", "IN_ONLYDIR", "IN_Q_OVERFLOW", "Inotify"]

# <sys/inotify.h>
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
_IN_NONBLOCK = os.O_NONBLOCK  # the kernel defines them as the open(2) flags
_IN_CLOEXEC = os.O_CLOEXEC

_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (of the name that follows)
_READ_SIZE = 64 * 1024  # room for many events; one needs at most 16 + NAME_MAX + 1


def _libc_function(name: str, argtypes: list[type]) -> Callable[..., int]:
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (AttributeError, OSError) as exc:
        raise OSError(errno.ENOSYS, f"{name} not in this libc") from exc
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function


def _failed(call: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{call}: {os.strerror(code)}")


class Inotify:
    """One non-blocking inotify fd (closed on exec). Raises OSError where it cannot
    be made (no such call, ``max_user_instances`` reached, EMFILE)."""

    def __init__(self) -> None:
        self._add = _libc_function("inotify_add_watch",
                                   [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32])
        self._rm = _libc_function("inotify_rm_watch", [ctypes.c_int, ctypes.c_int])
        fd = _libc_function("inotify_init1", [ctypes.c_int])(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            raise _failed("inotify_init1")
        self.fd: int | None = fd
        # Closed with the object too, for an owner that never called close().
        self._close_fd = weakref.finalize(self, os.close, fd)

    def add_watch(self, path: str, mask: int) -> int:
        """The watch descriptor of ``path`` (the same one again for a watched path)."""
        wd = self._add(self._open_fd(), os.fsencode(path), mask)
        if wd < 0:
            raise _failed("inotify_add_watch")
        return int(wd)

    def rm_watch(self, wd: int) -> None:
        """Remove a watch (the kernel then queues IN_IGNORED for it)."""
        if self._rm(self._open_fd(), wd) < 0:
            raise _failed("inotify_rm_watch")

    def read(self) -> list[tuple[int, int]]:
        """(wd, mask) of the events queued now; empty when there are none (never waits)."""
        try:
            data = os.read(self._open_fd(), _READ_SIZE)
        except BlockingIOError:
            return []
        events = []
        pos = 0
        while pos < len(data):
            wd, mask, _cookie, size = _EVENT.unpack_from(data, pos)
            events.append((wd, mask))
            pos += _EVENT.size + size
        return events

    def close(self) -> None:
        """Close the fd; the kernel drops every watch with it."""
        self._close_fd()  # once: later calls do nothing
        self.fd = None

    def _open_fd(self) -> int:
        if self.fd is None:
            raise OSError(errno.EBADF, "inotify fd closed")
        return self.fd
