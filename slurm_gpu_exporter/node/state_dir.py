"""The state directory: what must survive an agent restart.

Per-job counters (CPU seconds gathered from processes, GPU busy/allocated
seconds and energy) and memory peaks are saved after every sample that changed
them, atomically, so that a restart never makes a counter go down. A sample that
changed nothing writes nothing; a save is fsynced at most once a minute
(SYNC_INTERVAL says why). A state file that cannot be
read, or is of the wrong shape, is moved aside (never deleted) and the agent starts
fresh.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

STATE_VERSION = 1
STATE_FILE = "state.json"


# Owner-only: the state names users and jobs.
FILE_MODE = 0o600
# A save is written and renamed into place whenever the state changed (a restart of the
# agent reads the last one, fsynced or not: the page cache outlives the process), and
# fsynced at most this often. The fsync only matters to a crash of the node, and after
# one the state is of the boot before: the driver's cursors and energy readings are
# dropped by their boot id, and the job runs it counted died with the node. Fsyncing
# every 5 s sample cost the sampler 4 ms of waiting and 0.2 ms of CPU.
SYNC_INTERVAL = 60.0


class StateStore:
    """Load and save one JSON document in the state directory.

    Every file is opened relative to a descriptor of the directory, without following
    a symbolic link (``O_NOFOLLOW``), and the temporary file is made afresh
    (``O_EXCL``): a link planted under the state dir cannot make the agent write
    elsewhere. After the rename the directory is fsynced, so the new file survives a
    crash of the node (at most every ``sync_interval`` seconds: SYNC_INTERVAL).
    """

    def __init__(self, state_dir: Path, sync_interval: float = SYNC_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``sync_interval``: seconds between saves that are also fsynced (see
        SYNC_INTERVAL); the saves between are written and renamed all the same."""
        self.state_dir = state_dir
        self.path = state_dir / STATE_FILE
        self.sync_interval = sync_interval
        self._clock = clock
        # What the last successful save wrote: the same document is not written again.
        self._saved: str | None = None
        self._synced_at: float | None = None  # when a save was last fsynced
        # What the last save wrote less what may wait (save's ``steady``), and when.
        self._saved_steady: str | None = None
        # The last save's document as read back from its JSON: an unchanged state is
        # found by comparing objects, without serializing it (an idle node's sample).
        # Not read back while every sample writes (jobs running): it would not be used.
        self._saved_doc: dict[str, Any] | None = None
        self._wrote_last = False  # whether the last call wrote
        self._written_at: float | None = None

    def _open_dir(self, create: bool = False) -> int:
        if create:
            self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        return os.open(self.state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def load(self) -> dict[str, Any]:
        """The saved state, or {} when there is none or it is unreadable.

        A file that is not a JSON object of this version, or whose parts are not JSON
        objects (``"jobs": []``), is moved aside (never deleted)."""
        try:
            dir_fd = self._open_dir()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.warning("cannot open state dir %s: %s; counters start from their current "
                        "values", self.state_dir, exc.strerror)
            return {}
        try:
            return self._load(dir_fd)
        finally:
            os.close(dir_fd)

    def _load(self, dir_fd: int) -> dict[str, Any]:
        try:
            fd = os.open(STATE_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dir_fd)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            # ELOOP: a symbolic link in place of the file; moved aside like a bad file.
            if exc.errno != errno.ELOOP:
                log.warning("cannot read state file %s: %s; counters start from their "
                            "current values", self.path, exc.strerror)
                return {}
            self._move_aside(dir_fd, "a symbolic link, not a file")
            return {}
        try:
            with os.fdopen(fd, "rb") as handle:
                raw = handle.read()
        except OSError as exc:
            log.warning("cannot read state file %s: %s; counters start from their current "
                        "values", self.path, exc.strerror)
            return {}
        try:
            data = json.loads(raw)
            _check_shape(data)
        except ValueError as exc:
            self._move_aside(dir_fd, str(exc))
            return {}
        return data

    def move_aside(self, reason: str) -> None:
        """Move the state file aside as unusable (a consumer could not take it in)."""
        try:
            dir_fd = self._open_dir()
        except OSError:
            return
        try:
            self._move_aside(dir_fd, reason)
        finally:
            os.close(dir_fd)

    def _move_aside(self, dir_fd: int, reason: str) -> None:
        aside = f"{STATE_FILE}.corrupt-{int(time.time())}"
        try:
            os.replace(STATE_FILE, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            where = f"moved aside to {self.state_dir / aside}"
        except OSError:
            where = "left in place"
        log.warning("state file %s is unusable (%s); %s, starting fresh",
                    self.path, reason, where)

    def save(self, data: dict[str, Any], may_wait: tuple[str, str] | None = None,
             hold_s: float = 0.0) -> bool:
        """Write the state atomically unless it is what the last save wrote and that file
        is still in place; True when written. Raises OSError (the caller counts it).

        ``may_wait``: (part, key) of ``data`` whose change alone may wait up to
        ``hold_s`` seconds (the GPUs' sample cursors, which move with every sample on
        idle GPUs that keep sampling): while the rest is what the last save wrote, the
        file is not rewritten more often than that."""
        doc = {**data, "version": STATE_VERSION}
        wait = may_wait if hold_s > 0 else None
        now = self._clock()
        if self._unchanged(doc, wait, hold_s, now) and self.path.exists():
            self._wrote_last = False
            return False
        payload, still = _serialized(doc, wait)
        if ((payload == self._saved or (
                still is not None and still == self._saved_steady
                and self._written_at is not None and now - self._written_at < hold_s))
                and self.path.exists()):
            if self._saved_doc is None and self._saved is not None:
                self._saved_doc = json.loads(self._saved)  # unchanged now: compare objects
            self._wrote_last = False
            return False
        self._saved = self._saved_steady = self._saved_doc = None
        sync = self._synced_at is None or now - self._synced_at >= self.sync_interval
        dir_fd = self._open_dir(create=True)
        try:
            _write_atomically(dir_fd, payload.encode(), sync)
        finally:
            os.close(dir_fd)
        self._saved, self._saved_steady, self._written_at = payload, still, now
        self._saved_doc = None if self._wrote_last else json.loads(payload)
        self._wrote_last = True
        if sync:
            self._synced_at = now
        return True

    def _unchanged(self, doc: dict[str, Any], wait: tuple[str, str] | None, hold_s: float,
                   now: float) -> bool:
        """``doc`` equals what the last save wrote, or does but for the entry ``wait``
        names while the hold lasts. A value JSON writes otherwise than it reads back (a
        tuple, a number as a key) compares unequal: the serialized check decides then."""
        saved = self._saved_doc
        if saved is None:
            return False
        if doc == saved:
            return True
        return (wait is not None and self._written_at is not None
                and now - self._written_at < hold_s
                and _less(doc, wait) == _less(saved, wait))


def _less(doc: dict[str, Any], wait: tuple[str, str]) -> dict[str, Any]:
    """``doc`` without the entry ``wait`` names (part, key)."""
    part, key = wait
    inner = doc.get(part)
    if not isinstance(inner, dict) or key not in inner:
        return doc
    return {**doc, part: {k: v for k, v in inner.items() if k != key}}


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def _serialized(data: dict[str, Any], may_wait: tuple[str, str] | None
                ) -> tuple[str, str | None]:
    """(``data`` as JSON, byte for byte what one ``json.dumps`` writes; the same less
    the entry ``may_wait`` names, None without one). Both are joined from the same
    pieces: a large state (64 jobs) is serialized once, not twice."""
    if may_wait is None or not isinstance(data.get(may_wait[0]), dict):
        return _dumps(data), None
    part, key = may_wait
    whole, less = [], []
    for name, value in data.items():
        if name == part:
            inner = [(k, f"{_dumps(k)}:{_dumps(v)}") for k, v in value.items()]
            full = "{" + ",".join(piece for _, piece in inner) + "}"
            steady = "{" + ",".join(piece for k, piece in inner if k != key) + "}"
        else:
            full = steady = _dumps(value)
        whole.append(f"{_dumps(name)}:{full}")
        less.append(f"{_dumps(name)}:{steady}")
    return "{" + ",".join(whole) + "}", "{" + ",".join(less) + "}"


def _check_shape(data: object) -> None:
    """Raise ValueError unless ``data`` is a state document: an object of this version
    whose parts (``jobs``, ``gpu``) are objects."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.get("version") != STATE_VERSION:
        raise ValueError(f"unknown state format (version {data.get('version')!r})")
    for key, value in data.items():
        if key != "version" and not isinstance(value, dict):
            raise ValueError(f"{key!r} is a {type(value).__name__}, not a JSON object")


def _write_atomically(dir_fd: int, payload: bytes, sync: bool = True) -> None:
    """Write ``payload`` to a fresh temporary file and rename it over the state file;
    with ``sync``, the file and then the directory are fsynced."""
    tmp = f".{STATE_FILE}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dir_fd)  # left by a crash: the name, never what it points at
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, FILE_MODE, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            if sync:
                os.fsync(handle.fileno())
        os.replace(tmp, STATE_FILE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    if sync:
        os.fsync(dir_fd)  # the rename itself survives a crash of the node


# -- per-boot readings of the driver ------------------------------------------
# Driver sample cursors and energy readings are only good for the boot and the driver
# they were read in: drivers stamp samples on clocks that restart with the boot
# (CLOCK_BOOTTIME) or with the driver, and count energy since the driver loaded. They
# are saved with the boot id and the driver version.

BOOT_ID_PATH = Path("sys/kernel/random/boot_id")


def read_boot_id(proc_root: Path) -> str | None:
    """This boot's id (``/proc/sys/kernel/random/boot_id`` under ``proc_root``); None
    where it cannot be read."""
    try:
        text = (proc_root / BOOT_ID_PATH).read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    boot_id = text.strip()
    return boot_id if 0 < len(boot_id) <= 64 else None


def stamp_boot(by_gpu: dict[str, Any], boot_id: str | None,
               driver: str | None) -> dict[str, Any]:
    """Per-GPU readings as saved: with the boot and the driver version they are of."""
    return {"boot_id": boot_id, "driver": driver, "gpus": by_gpu}


def of_this_boot(saved: Any, boot_id: str | None,
                 what: str = "driver sample cursors",
                 then: str = "each GPU's first poll starts afresh",
                 ) -> tuple[dict[str, Any], str | None]:
    """The saved readings by GPU and the driver version they were read from; none where
    they were saved in another boot, or in a form this version does not read. ``what``
    and ``then`` name them and the consequence in the log line."""
    if not isinstance(saved, dict) or not isinstance(saved.get("gpus"), dict):
        return {}, None
    if saved.get("boot_id") != boot_id:
        log.info("the %s in the state dir are from another boot; they are dropped and %s",
                 what, then)
        return {}, None
    driver = saved.get("driver")
    return saved["gpus"], driver if isinstance(driver, str) else None
