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
import threading
import time
from collections.abc import Callable

from prometheus_client.metrics_core import Metric

from slurm_gpu_exporter.training_relay.admission import Admission, JobOfKey, JobOfPid, PendingJob
from slurm_gpu_exporter.training_relay.connections import Connection, Connections
from slurm_gpu_exporter.training_relay.limits import RelayLimits
from slurm_gpu_exporter.training_relay.messages import read_messages
from slurm_gpu_exporter.training_relay.series import JobIdentity
from slurm_gpu_exporter.training_relay.socketfile import SOCKET_NAME, bind_socket, remove_socket
from slurm_gpu_exporter.training_relay.store import TrainingStore

log = logging.getLogger(__name__)

_ACCEPTS_PER_TURN = 64


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
        self._connections = Connections()
        self._admission = Admission(self.limits, self.store, job_of_pid)

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
        self._connections.selector = self._selector
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
        for conn in list(self._connections.open):
            self._connections.close(conn)
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
                self._connections.unmute(self._clock())
                self._resolve_pending()
            except Exception:  # one bad turn must not end the relay
                log.exception("training relay: unexpected error; continuing")
                time.sleep(0.1)

    def _next_timeout(self) -> float | None:
        due = [t for t in (self._connections.next_due(), self._admission.paused_until)
               if t is not None]
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
            admitted = self._admission.admit(sock, self._connections.open, self._clock())
            if admitted is not None:
                self._take_in(*admitted)
            elif self._admission.paused_until is not None:
                self._selector.unregister(self._listener)  # the kernel holds the queue
                return

    def _take_in(self, conn: Connection, found: tuple[str, str] | PendingJob) -> None:
        if isinstance(found, PendingJob):
            self._connections.wait(conn, self._clock() + self.limits.pending_seconds)
        else:
            self._connections.attach(conn, JobIdentity(str(found[0]), str(found[1])))

    def _resume_accepting(self) -> None:
        if self._admission.resume(self._clock()):
            assert self._selector is not None and self._listener is not None
            self._selector.register(self._listener, selectors.EVENT_READ, "accept")

    def _resolve_pending(self) -> None:
        """Attach the pending connections whose job is known now; refuse the overdue."""
        self._connections.resolve_pending(self._job_of_key)
        for conn in self._connections.take_overdue(self._clock()):
            self.store.count("refused")
            self._connections.close(conn)

    def _read(self, conn: Connection) -> None:
        wait = read_messages(conn, self.store, self._to_close)
        if wait is None:
            self._connections.close(conn)
        elif wait > 0:
            self._connections.mute(conn, self._clock() + wait)

    def _close_forgotten(self) -> None:
        with self._lock:
            jobids, self._to_close = self._to_close, set()
        if jobids:
            self._connections.close_jobs(jobids)
