"""Whether the directories a job listing read changed since, from inotify.

cgroupfs leaves a directory's mtime as it is when a child cgroup is made or removed,
but the VFS tells inotify of every ``mkdir``/``rmdir``: a watch on each directory a
listing read (Slurm's roots and their ``uid_<n>`` dirs, the v2 stepd scopes; never a
job's own dir, whose subtree a user may be delegated) makes "nothing changed" one
non-blocking ``read`` instead of a listing per directory.

Where inotify is not available (no such call, seccomp, ``max_user_instances`` or
``max_user_watches`` reached) every sample lists, as without this module.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Hashable
from typing import Protocol

from slurm_gpu_exporter.node.cgroup.inotify import (
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    Inotify,
)

__all__ = ["FULL_LISTING_S", "DirWatch"]

log = logging.getLogger("slurm_gpu_exporter")

# Seconds after which the directories are listed whatever inotify said: a safety net
# for what a watch could miss, as the spool's stat check has one.
FULL_LISTING_S = 60.0

# A child made, removed or renamed, or the directory itself gone. ONLYDIR: a root
# replaced by a file in between is no directory to trust.
MASK = (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF
        | IN_MOVE_SELF | IN_ONLYDIR)
# Watch limits reached: retried at each listing, told once.
_EXHAUSTED = (errno.ENOSPC, errno.EMFILE, errno.ENFILE, errno.ENOMEM)


class Events(Protocol):
    """What DirWatch uses of an inotify fd (``inotify.Inotify``; tests give their own)."""

    def add_watch(self, path: str, mask: int) -> int: ...
    def rm_watch(self, wd: int) -> None: ...
    def read(self) -> list[tuple[int, int]]: ...
    def close(self) -> None: ...


class DirWatch:
    """Watches the directories one listing reads; says whether a listing may be skipped.

    A listing: ``unchanged(key, now)`` (False: list), ``watch(dir)`` before listing
    each directory, ``listed(complete)`` after. Events are drained in ``unchanged``,
    before the listing: a change made after the drain is both listed and queued (at
    worst one listing more, never one missed).
    """

    def __init__(self, open_fd: Callable[[], Events] = Inotify,
                 full_listing_s: float = FULL_LISTING_S) -> None:
        self._open = open_fd
        self._full_listing_s = full_listing_s
        self._fd: Events | None = None
        self._told = False  # "inotify unavailable" logged
        self._wds: dict[str, int] = {}  # watched dir -> watch descriptor
        self._dirs: dict[int, str] = {}  # watch descriptor -> dir
        self._listing: set[str] = set()  # dirs watched by the listing under way
        self._complete = False  # every dir of the last listing watched, none gone
        self._watched_all = False  # no watch failed in the listing under way
        self._key: Hashable = None  # what the last listing listed (the roots)
        self._listed_at = 0.0

    def unchanged(self, key: Hashable, now: float) -> bool:
        """True when the last listing of ``key`` still holds; else drains the events
        and starts a new listing (call ``watch`` then ``listed``)."""
        if self._fd is None:
            self._start()
        quiet = self._drain()
        if (quiet and self._complete and key == self._key
                and now - self._listed_at < self._full_listing_s):
            return True
        self._key, self._listed_at = key, now
        # Set again by listed() only: a listing cut short by an error is not reused.
        self._complete = False
        self._watched_all = self._fd is not None
        self._listing = set()
        return False

    def watch(self, path: str) -> None:
        """Watch ``path`` before it is listed (a child made after this call is seen)."""
        if self._fd is None:
            return
        self._listing.add(path)
        try:
            wd = self._fd.add_watch(path, MASK)
        except OSError as exc:
            # Gone already (the listing will say), or a limit: list next time too.
            self._watched_all = False
            if exc.errno in _EXHAUSTED:
                self._tell(f"cannot add an inotify watch on {path}: {exc.strerror}")
            return
        old = self._wds.get(path)
        if old is not None and old != wd:
            self._dirs.pop(old, None)
        self._wds[path] = wd
        self._dirs[wd] = path  # re-watching a path returns its wd: no leak

    def listed(self, complete: bool) -> None:
        """The listing is done; ``complete``: every directory it meant to read was there.
        Watches of directories it no longer read are removed."""
        self._complete = self._watched_all and complete
        for path in [p for p in self._wds if p not in self._listing]:
            wd = self._wds.pop(path)
            others = [p for p, w in self._wds.items() if w == wd]
            if others:  # the same directory under another path (a bind mount)
                self._dirs[wd] = others[0]
                continue
            self._dirs.pop(wd, None)
            if self._fd is not None:
                try:
                    self._fd.rm_watch(wd)
                except OSError:
                    pass  # removed by the kernel already (the dir went)

    def close(self) -> None:
        """Close the inotify fd (the owner's close); a later listing opens a new one."""
        if self._fd is not None:
            self._fd.close()
        self._fd = None
        self._wds.clear()
        self._dirs.clear()
        self._complete = False

    def watched(self) -> list[str]:
        """The directories watched now (for tests)."""
        return sorted(self._wds)

    def _start(self) -> None:
        try:
            self._fd = self._open()
        except OSError as exc:
            self._tell(f"cannot open inotify: {exc.strerror or exc}")

    def _drain(self) -> bool:
        """Read every queued event; True when none concerned a watched directory."""
        if self._fd is None:
            return False
        quiet = True
        try:
            while events := self._fd.read():
                for wd, mask in events:
                    if mask & IN_Q_OVERFLOW:
                        quiet = False
                    elif wd in self._dirs:
                        quiet = False
                        if mask & IN_IGNORED:  # the kernel dropped it: the dir went
                            self._forget(wd)
                    # Else a watch removed by listed(): its dir is no longer read.
        except OSError as exc:
            self._tell(f"reading inotify failed: {exc.strerror or exc}")
            self.close()
            return False
        return quiet

    def _forget(self, wd: int) -> None:
        del self._dirs[wd]
        for path in [p for p, w in self._wds.items() if w == wd]:
            del self._wds[path]

    def _tell(self, what: str) -> None:
        if not self._told:
            self._told = True
            log.info("%s; the Slurm cgroup roots are listed at every sample instead "
                     "(nothing to do: only a little more CPU)", what)
