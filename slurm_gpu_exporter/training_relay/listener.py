"""The unix socket training scripts push to, and the thread that serves it.

``training.sock`` in the spool dir is a SOCK_SEQPACKET socket: one message per push,
boundaries kept by the kernel. Who sent a message is taken from the connection's
SO_PEERCRED pid, mapped to a job by the injected ``job_of_pid``; nothing the payload
says about its job is believed. A job over its message rate is not read from until
its budget refills, so a flood fills the sender's own socket buffer (the client then
drops) instead of the agent's CPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

from slurm_gpu_exporter.training_relay.store import JobIdentity, RelayLimits, TrainingStore

log = logging.getLogger(__name__)

SOCKET_NAME = "training.sock"
# sockaddr_un.sun_path holds 108 bytes, the final NUL included.
_MAX_SOCKET_PATH = 107
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
# Messages read from one connection before the others get a turn.
_READS_PER_TURN = 32
_ACCEPTS_PER_TURN = 64

JobOfPid = Callable[[int], "tuple[str, str] | None"]


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    pid: int
    job: JobIdentity
    muted_until: float = 0.0
    closed: bool = field(default=False)


class TrainingRelay:
    """Serves ``<spool_dir>/training.sock`` from a thread of its own.

    ``job_of_pid(pid)`` returns ``(jobid, user)`` of the job whose cgroup holds the
    process, or None; it is called on the relay thread, once per connection, and must
    be safe to call there. Start with ``start()``, end with ``stop()``; read with
    ``families()`` and ``error_counts()`` from any thread; ``forget(jobid)`` when the
    job's linger has passed.
    """

    def __init__(self, spool_dir: str | os.PathLike[str], job_of_pid: JobOfPid, *,
                 limits: RelayLimits | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = os.path.join(os.fspath(spool_dir), SOCKET_NAME)
        self.store = TrainingStore(limits, clock=clock)
        self.limits = self.store.limits
        self._job_of_pid = job_of_pid
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
        self._muted: list[_Connection] = []

    # -- life -----------------------------------------------------------------------

    def start(self) -> None:
        """Bind the socket (mode 0666: any job's user may connect) and start the thread.

        Raises OSError (or ValueError for a path too long) with a one-line message when
        the socket cannot be made; the agent then runs without the relay.
        """
        if len(os.fsencode(self.path)) > _MAX_SOCKET_PATH:
            raise ValueError(f"training socket path is too long for a unix socket "
                             f"({len(self.path)} > {_MAX_SOCKET_PATH} bytes): {self.path}")
        # Bind under a temporary name and rename over the old socket: a client never
        # finds the path missing or with the wrong mode while the agent restarts.
        tmp = os.path.join(os.path.dirname(self.path), f".training.{os.getpid()}.sock")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            listener.bind(tmp)
            os.chmod(tmp, 0o666)
            listener.listen(128)
            listener.setblocking(False)
            self._inode = os.lstat(tmp).st_ino
            os.replace(tmp, self.path)
        except OSError:
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._listener = listener
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, "accept")
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
            with contextlib.suppress(OSError):
                st = os.lstat(self.path)
                # Leave a socket a newer agent put there in place.
                if stat.S_ISSOCK(st.st_mode) and st.st_ino == self._inode:
                    os.unlink(self.path)
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

    def errors_total(self) -> int:
        """All refusals so far."""
        return sum(self.store.error_counts().values())

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
                self._unmute()
            except Exception:  # one bad turn must not end the relay
                log.exception("training relay: unexpected error; continuing")
                time.sleep(0.1)

    def _next_timeout(self) -> float | None:
        if not self._muted:
            return None
        return max(0.0, min(c.muted_until for c in self._muted) - self._clock())

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(4096):
                pass

    def _accept(self) -> None:
        assert self._listener is not None
        for _ in range(_ACCEPTS_PER_TURN):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors: try again next turn
                log.warning("training relay: cannot accept a connection: %s", exc)
                return
            self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        try:
            pid = _PEERCRED.unpack(sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))[0]
            found = self._job_of_pid(pid) if pid > 0 else None
        except Exception:  # the mapper failing is the same as "in no job"
            found = None
        if found is None:
            self.store.count("refused")
            sock.close()
            return
        job = JobIdentity(str(found[0]), str(found[1]))
        same_job = sum(1 for c in self._connections if c.job.jobid == job.jobid)
        if (len(self._connections) >= self.limits.max_connections
                or same_job >= self.limits.max_connections_per_job):
            self.store.count("connections")
            sock.close()
            return
        conn = _Connection(sock, pid, job)
        self._connections.add(conn)
        assert self._selector is not None
        self._selector.register(sock, selectors.EVENT_READ, conn)

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
            if conn.job.jobid in self._to_close:
                return  # forgotten: closed at the end of this turn, nothing more kept
            # Every message counts against the rate, refused ones too: an oversized
            # flood must not cost more than a well-formed one.
            lines = self.store.lines_of(data)
            oversized = truncated or lines > self.limits.max_lines_per_message
            wait = self.store.admit(conn.job.jobid, 1 if oversized else lines)
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
        conn.muted_until = self._clock() + seconds
        self._muted.append(conn)

    def _unmute(self) -> None:
        if not self._muted:
            return
        now = self._clock()
        due = [c for c in self._muted if c.muted_until <= now]
        if not due:
            return
        self._muted = [c for c in self._muted if c.muted_until > now]
        assert self._selector is not None
        for conn in due:
            if not conn.closed:
                self._selector.register(conn.sock, selectors.EVENT_READ, conn)

    def _close_forgotten(self) -> None:
        with self._lock:
            jobids, self._to_close = self._to_close, set()
        if jobids:
            for conn in [c for c in self._connections if c.job.jobid in jobids]:
                self._close(conn)

    def _close(self, conn: _Connection) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._connections.discard(conn)
        if conn in self._muted:
            self._muted.remove(conn)
        elif self._selector is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)
        conn.sock.close()
