"""The unix socket training scripts push to, and the thread that serves it.

``training.sock`` in the spool dir is a SOCK_SEQPACKET socket: one message per push,
boundaries kept by the kernel. Who sent a message is taken from the connection's
SO_PEERCRED pid, mapped to a job by the injected ``job_of_pid``; nothing the payload
says about its job is believed. A process in the cgroup of a job the agent has not
taken in yet (the job started since its last sample) waits, unread, until the agent
knows the job. A job over its message rate is not read from until its budget
refills, so a flood fills the sender's own socket buffer (the client then drops)
instead of the agent's CPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

from slurm_gpu_exporter.training_relay.socketfile import SOCKET_NAME, bind_socket, remove_socket
from slurm_gpu_exporter.training_relay.store import JobIdentity, RelayLimits, TrainingStore

log = logging.getLogger(__name__)

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
# Messages read from one connection before the others get a turn.
_READS_PER_TURN = 32
_ACCEPTS_PER_TURN = 64


@dataclass(frozen=True)
class PendingJob:
    """``job_of_pid``'s answer for a process in the cgroup of a job the agent does not
    know yet: ``key`` is the job's cgroup key (a job id, or a SLUID), asked of
    ``job_of_key`` again until it names the job or ``limits.pending_seconds`` pass."""

    key: str


JobOfPid = Callable[[int], "tuple[str, str] | PendingJob | None"]
JobOfKey = Callable[[str], "tuple[str, str] | None"]


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    pid: int
    uid: int
    job: JobIdentity | None  # None while pending
    key: str  # the job's id, or while pending the cgroup key it waits for
    closed: bool = field(default=False)


class _Refusals:
    """Refusals of processes in no job, counted per uid and in all, per second."""

    def __init__(self) -> None:
        self.second = -1
        self.total = 0
        self.by_uid: dict[int, int] = {}

    def _roll(self, now: float) -> None:
        if int(now) != self.second:
            self.second, self.total, self.by_uid = int(now), 0, {}

    def note(self, uid: int, now: float) -> None:
        self._roll(now)
        self.total += 1
        self.by_uid[uid] = self.by_uid.get(uid, 0) + 1

    def of(self, uid: int, now: float) -> int:
        self._roll(now)
        return self.by_uid.get(uid, 0)


class _Aside:
    """Connections not read for now (muted, or pending), each until a time."""

    def __init__(self) -> None:
        self._until: dict[_Connection, float] = {}

    def add(self, conn: _Connection, until: float) -> None:
        self._until[conn] = until

    def discard(self, conn: _Connection) -> bool:
        """Take ``conn`` out; whether it was here."""
        return self._until.pop(conn, None) is not None

    def next_due(self) -> float | None:
        return min(self._until.values(), default=None)

    def take_due(self, now: float) -> list[_Connection]:
        """Take out and return the connections whose time has come."""
        due = [conn for conn, until in self._until.items() if until <= now]
        for conn in due:
            del self._until[conn]
        return due

    def __iter__(self) -> Iterator[_Connection]:
        return iter(list(self._until))


class _Admission:
    """Who may connect: a process in a job (by its pid's cgroup), within the caps per
    job, per user and in all; a uid refused too often is refused without a look-up."""

    def __init__(self, limits: RelayLimits, store: TrainingStore, job_of_pid: JobOfPid
                 ) -> None:
        self.limits = limits
        self.store = store
        self.job_of_pid = job_of_pid
        self.refusals = _Refusals()
        # Past the refusals a second allows, no connection is accepted until then.
        self.paused_until: float | None = None

    def admit(self, sock: socket.socket, connections: set[_Connection], now: float
              ) -> tuple[_Connection, tuple[str, str] | PendingJob] | None:
        """The new connection and what its job look-up said; None when refused (the
        socket is closed and the refusal counted)."""
        try:
            pid, uid = _peer_cred(sock)
        except OSError:
            sock.close()
            return None
        found = None
        if self.refusals.of(uid, now) < self.limits.refusals_per_user_per_second:
            try:
                found = self.job_of_pid(pid) if pid > 0 else None
            except Exception:  # the mapper failing is the same as "in no job"
                found = None
        if found is None:  # in no job, or churning: no look-up for the rest of the second
            sock.close()
            self.store.count("refused")
            self.refusals.note(uid, now)
            if self.refusals.total >= self.limits.max_refusals_per_second:
                self.paused_until = float(int(now) + 1)
            return None
        key = found.key if isinstance(found, PendingJob) else str(found[0])
        same_job = same_user = 0
        for c in connections:
            same_job += c.key == key
            same_user += c.uid == uid
        if (len(connections) >= self.limits.max_connections
                or same_job >= self.limits.max_connections_per_job
                or same_user >= self.limits.max_connections_per_user):
            self.store.count("connections")
            sock.close()
            return None
        return _Connection(sock, pid, uid, None, key), found

    def resume(self, now: float) -> bool:
        """True once, when a pause of accepting is over."""
        if self.paused_until is None or now < self.paused_until:
            return False
        self.paused_until = None
        return True


def _peer_cred(sock: socket.socket) -> tuple[int, int]:
    """The connecting process's pid and uid, from the kernel (pid 0: in a pid namespace
    we cannot see)."""
    pid, uid, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                   _PEERCRED.size))
    return pid, uid


class TrainingRelay:
    """Serves ``<spool_dir>/training.sock`` from a thread of its own.

    ``job_of_pid(pid)``: ``(jobid, user)`` of the job whose cgroup holds the process,
    None (in no job), or ``PendingJob`` (job not known yet: ``job_of_key(key)`` is asked
    at each ``jobs_changed()`` until it answers or ``limits.pending_seconds`` pass).
    Both run on the relay thread only. ``start()``, ``stop()``; ``families()``,
    ``jobs()``, ``error_counts()`` from any thread; ``forget(jobid)`` after the linger.
    """

    def __init__(self, spool_dir: str | os.PathLike[str], job_of_pid: JobOfPid, *,
                 job_of_key: JobOfKey | None = None,
                 limits: RelayLimits | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = os.path.join(os.fspath(spool_dir), SOCKET_NAME)
        self.store = TrainingStore(limits, clock=clock)
        self.limits = self.store.limits
        self._job_of_pid = job_of_pid
        self._job_of_key = job_of_key
        self._clock = clock
        self._listener: socket.socket | None = None
        self._inode = -1  # of the socket file we bound, to remove only our own
        self._selector: selectors.BaseSelector | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._to_close: set[str] = set()  # jobids forgotten, connections not yet closed
        self._connections: set[_Connection] = set()
        self._muted = _Aside()  # their job is over its rate
        self._pending = _Aside()  # their job is not known yet
        self._admission = _Admission(self.limits, self.store, job_of_pid)

    # -- life -----------------------------------------------------------------------

    def start(self) -> None:
        """Bind the socket (mode 0666: any job's user may connect) and start the thread.

        Raises OSError (or ValueError for a path too long) with a one-line message when
        the socket cannot be made; the agent then runs without the relay.
        """
        self._listener, self._inode = bind_socket(self.path)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name="training-relay", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread, close every connection and remove the socket."""
        self._stopping.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._listener is not None:
            remove_socket(self.path, self._inode)
            self._listener.close()
        for conn in list(self._connections):
            self._close(conn)
        if self._selector is not None:
            self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- what the agent calls -------------------------------------------------------

    def families(self) -> list[Metric]:
        """Current jobs' training families, labelled with jobid and user."""
        return self.store.families()

    def error_counts(self) -> dict[str, int]:
        """Refusals so far by reason; their sum is sample_errors_total{source="training"}."""
        return self.store.error_counts()

    def jobs(self) -> set[str]:
        """Jobs the relay holds anything of (series or a rate budget)."""
        return self.store.known_jobs()

    def jobs_changed(self) -> None:
        """The agent's jobs changed: pending connections are checked again."""
        self._wake()

    def forget(self, jobid: str) -> None:
        """Drop the job's series and close its connections."""
        self.store.forget(jobid)
        with self._lock:
            self._to_close.add(jobid)
        self._wake()

    def connections(self) -> int:
        """Open connections (for the agent's own metrics and tests)."""
        return len(self._connections)

    # -- the thread -----------------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _run(self) -> None:
        assert self._selector is not None
        while not self._stopping.is_set():
            try:
                events = self._selector.select(self._next_timeout())
                for key, _ in events:
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        self._read(key.data)
                self._close_forgotten()
                self._resume_accepting()
                self._unmute()
                self._resolve_pending()
            except Exception:  # one bad turn must not end the relay
                log.exception("training relay: unexpected error; continuing")
                time.sleep(0.1)

    def _next_timeout(self) -> float | None:
        due = [t for t in (self._muted.next_due(), self._pending.next_due(),
                           self._admission.paused_until) if t is not None]
        return max(0.0, min(due) - self._clock()) if due else None

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(4096):
                pass

    def _accept(self) -> None:
        assert self._listener is not None and self._selector is not None
        for _ in range(_ACCEPTS_PER_TURN):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors: try again next turn
                log.warning("training relay: cannot accept a connection: %s", exc)
                return
            sock.setblocking(False)
            admitted = self._admission.admit(sock, self._connections, self._clock())
            if admitted is not None:
                self._take_in(*admitted)
            elif self._admission.paused_until is not None:
                self._selector.unregister(self._listener)  # the kernel holds the queue
                return

    def _take_in(self, conn: _Connection, found: tuple[str, str] | PendingJob) -> None:
        self._connections.add(conn)
        if isinstance(found, PendingJob):
            self._pending.add(conn, self._clock() + self.limits.pending_seconds)
        else:
            self._attach(conn, JobIdentity(str(found[0]), str(found[1])))

    def _resume_accepting(self) -> None:
        if self._admission.resume(self._clock()):
            assert self._selector is not None and self._listener is not None
            self._selector.register(self._listener, selectors.EVENT_READ, "accept")

    def _attach(self, conn: _Connection, job: JobIdentity) -> None:
        """Start reading the connection: its sender is proven to run in ``job``."""
        conn.job, conn.key = job, job.jobid
        assert self._selector is not None
        self._selector.register(conn.sock, selectors.EVENT_READ, conn)

    def _resolve_pending(self) -> None:
        """Attach the pending connections whose job is known now; refuse the overdue."""
        for conn in self._pending:
            try:
                found = self._job_of_key(conn.key) if self._job_of_key else None
            except Exception:
                found = None
            if found is not None:
                self._pending.discard(conn)
                self._attach(conn, JobIdentity(str(found[0]), str(found[1])))
        for conn in self._pending.take_due(self._clock()):
            self.store.count("refused")
            self._close(conn)

    def _read(self, conn: _Connection) -> None:
        limit = self.limits.max_message_bytes
        for _ in range(_READS_PER_TURN):
            try:
                data, _, flags, _ = conn.sock.recvmsg(limit)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._close(conn)
                return
            truncated = bool(flags & socket.MSG_TRUNC)
            if not data and not truncated:
                self._close(conn)  # the sender hung up
                return
            if conn.key in self._to_close:
                return  # forgotten: closed at the end of this turn, nothing more kept
            # Every message counts against the rate, refused ones too: an oversized
            # flood must not cost more than a well-formed one.
            assert conn.job is not None  # only attached connections are read
            lines = self.store.lines_of(data)
            oversized = truncated or lines > self.limits.max_lines_per_message
            wait = self.store.admit(conn.key, 1 if oversized else lines)
            if wait > 0:
                self._mute(conn, wait)
                return
            if oversized:
                self.store.count("size")  # (the kernel dropped the rest of a long one)
                continue
            self.store.ingest(conn.job, data)

    def _mute(self, conn: _Connection, seconds: float) -> None:
        """Stop reading the connection for ``seconds``: its job is over its rate."""
        assert self._selector is not None
        self._selector.unregister(conn.sock)
        self._muted.add(conn, self._clock() + seconds)

    def _unmute(self) -> None:
        assert self._selector is not None
        for conn in self._muted.take_due(self._clock()):
            if not conn.closed:
                self._selector.register(conn.sock, selectors.EVENT_READ, conn)

    def _close_forgotten(self) -> None:
        with self._lock:
            jobids, self._to_close = self._to_close, set()
        if jobids:
            for conn in [c for c in self._connections
                         if c.job is not None and c.key in jobids]:
                self._close(conn)

    def _close(self, conn: _Connection) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._connections.discard(conn)
        # A muted or pending connection is not registered with the selector.
        if not self._muted.discard(conn) and not self._pending.discard(conn) and (
                self._selector is not None):
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)
        conn.sock.close()
