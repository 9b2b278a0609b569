"""The agent's side of the spool: read the records every sample, remove expired ones.

A file is parsed again only when its version (inode, mtime, size) changed, so a
sample costs one directory listing and one stat per record. A directory that did not
change since it was last listed (inode, mtime, ctime: the prolog and epilog write and
remove records by rename and unlink, which change them) is not listed again: a sample
then costs one stat. It is listed again at least every RELIST_S seconds all the same
(a record changed in place by hand). A refused file is counted under the ``spool``
source once per version, not once per sample.

Thread-confined to the sampler.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from slurm_gpu_exporter.hooks import spool
from slurm_gpu_exporter.node.source_health import SourceErrors

log = logging.getLogger(__name__)

# The longest an unchanged directory goes without being listed (a record edited in
# place changes the file, not the directory).
RELIST_S = 60.0
# A directory changed this close to its last listing (wall clock) is listed again: a
# change in the same clock tick as the listing would leave its mtime as it was.
SAME_TICK_S = 1.0


@dataclass(frozen=True)
class FileKey:
    """One version of a spool file."""

    ino: int
    mtime_ns: int
    size: int


class SpoolReader:
    """Reads the job records of one spool directory."""

    def __init__(self, spool_dir: str, errors: SourceErrors,
                 trusted_uids: frozenset[int] = frozenset({0}),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.spool_dir = spool_dir
        self.errors = errors
        self.trusted_uids = trusted_uids
        self._clock = clock
        # The last listing: (directory version, monotonic time of it, its records).
        self._listed: tuple[tuple[int, ...], float,
                            dict[str, tuple[FileKey, spool.JobRecord]]] | None = None
        self.listings = 0  # directory listings done (tests, benchmarks)
        # spool file name -> (file version, parsed record or None when refused)
        self._files: dict[str, tuple[FileKey, spool.JobRecord | None]] = {}
        self._missing_logged = False

    def read(self) -> dict[str, tuple[FileKey, spool.JobRecord]]:
        """Job id -> (file version, record) for every record that passes the checks."""
        try:
            dir_fd = spool.open_spool_dir(self.spool_dir)
        except FileNotFoundError:
            if not self._missing_logged:
                log.warning("spool directory %s does not exist yet; jobs are found through "
                            "cgroups only until the prolog creates it", self.spool_dir)
                self._missing_logged = True
            return {}
        except OSError as exc:
            self.errors.count("spool", f"cannot open spool directory {self.spool_dir}: "
                              f"{exc.strerror} (is it a symbolic link?)")
            return {}
        self._missing_logged = False
        records: dict[str, tuple[FileKey, spool.JobRecord]] = {}
        seen: set[str] = set()
        try:
            version = self._unchanged(dir_fd)
            if version is None:
                assert self._listed is not None
                return dict(self._listed[2])
            listed_at = self._clock()
            self.listings += 1
            with os.scandir(dir_fd) as entries:
                for entry in entries:
                    if entry.name.startswith(".") or entry.name == spool.TRAINING_SOCKET:
                        continue  # a record being written, or the training relay's socket
                    seen.add(entry.name)
                    result = self._read_entry(dir_fd, entry)
                    if result is not None:
                        key, record = result
                        records[record.jobid] = (key, record)
        finally:
            os.close(dir_fd)
        for name in [n for n in self._files if n not in seen]:
            del self._files[name]
        self._listed = (version, listed_at, records) if version else None
        return dict(records)

    def _unchanged(self, dir_fd: int) -> tuple[int, ...] | None:
        """None when the directory is as last listed (no listing needed); else its
        version to remember with the listing about to be made (() when it must not be
        trusted: changed within SAME_TICK_S of now)."""
        st = os.fstat(dir_fd)
        version = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        if (self._listed is not None and self._listed[0] == version
                and self._clock() - self._listed[1] < RELIST_S):
            return None
        changed = max(st.st_mtime_ns, st.st_ctime_ns) / 1e9
        return version if time.time() - changed >= SAME_TICK_S else ()

    def _read_entry(
        self, dir_fd: int, entry: os.DirEntry[str]
    ) -> tuple[FileKey, spool.JobRecord] | None:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            return None  # removed between listing and stat
        key = FileKey(st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._files.get(entry.name)
        if cached is not None and cached[0] == key:
            return (key, cached[1]) if cached[1] is not None else None
        record: spool.JobRecord | None = None
        if stat.S_ISLNK(st.st_mode):
            reason = "record is a symbolic link"
        else:
            try:
                record = spool.read_record(dir_fd, entry.name, self.trusted_uids)
                reason = ""
            except spool.SpoolError as exc:
                reason = str(exc)
        if record is None:
            # Counted once per version of the file, not once per sample.
            self.errors.count("spool", f"skipping spool file {entry.name!r}: {reason}")
        self._files[entry.name] = (key, record)
        return (key, record) if record is not None else None

    def record_version(self, jobid: str) -> FileKey | None:
        """The version of the job's record last read, None when it has no valid record."""
        cached = self._files.get(jobid + spool.RECORD_SUFFIX)
        return cached[0] if cached is not None and cached[1] is not None else None

    def remove(self, jobids: Iterable[str]) -> None:
        """Remove these jobs' records; a failure is logged, never raised."""
        jobids = list(jobids)
        if not jobids:
            return
        try:
            dir_fd = spool.open_spool_dir(self.spool_dir)
        except OSError:
            return
        try:
            for jobid in jobids:
                try:
                    spool.remove_record(dir_fd, jobid)
                except OSError as exc:
                    # Not fatal: the expired version is remembered and ignored, and
                    # removal is not tried again, so this is said once per record.
                    log.warning("cannot remove the expired spool record of job %s: %s; it "
                                "is ignored from now on, remove it by hand", jobid,
                                exc.strerror)
        finally:
            os.close(dir_fd)
