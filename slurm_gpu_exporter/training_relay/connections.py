"""The relay's open connections: each is read (registered with the selector), muted (its
job is over its rate) or pending (its job is not known to the agent yet), the last two
until a time. Used from the relay thread only."""

from __future__ import annotations

import contextlib
import selectors
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from slurm_gpu_exporter.training_relay.series import JobIdentity


@dataclass(eq=False)
class Connection:
    """One accepted connection and the sender the kernel named (SO_PEERCRED)."""

    sock: socket.socket
    pid: int
    uid: int
    job: JobIdentity | None  # None while pending
    key: str  # the job's id, or while pending the cgroup key it waits for
    closed: bool = field(default=False)


class _Aside:
    """Connections not read for now (muted, or pending), each until a time."""

    def __init__(self) -> None:
        self._until: dict[Connection, float] = {}

    def add(self, conn: Connection, until: float) -> None:
        self._until[conn] = until

    def discard(self, conn: Connection) -> bool:
        """Take ``conn`` out; whether it was here."""
        return self._until.pop(conn, None) is not None

    def next_due(self) -> float | None:
        return min(self._until.values(), default=None)

    def take_due(self, now: float) -> list[Connection]:
        """Take out and return the connections whose time has come."""
        due = [conn for conn, until in self._until.items() if until <= now]
        for conn in due:
            del self._until[conn]
        return due

    def __iter__(self) -> Iterator[Connection]:
        return iter(list(self._until))


class Connections:
    """The open connections and their state; ``selector`` is set when the relay starts."""

    def __init__(self) -> None:
        self.selector: selectors.BaseSelector | None = None
        self.open: set[Connection] = set()
        self._muted = _Aside()  # their job is over its rate
        self._pending = _Aside()  # their job is not known yet

    def __len__(self) -> int:
        return len(self.open)

    def next_due(self) -> float | None:
        """When the first muted or pending connection is due."""
        due = [t for t in (self._muted.next_due(), self._pending.next_due()) if t is not None]
        return min(due, default=None)

    def wait(self, conn: Connection, until: float) -> None:
        """Hold a new connection, unread, until its job is known or ``until``."""
        self.open.add(conn)
        self._pending.add(conn, until)

    def attach(self, conn: Connection, job: JobIdentity) -> None:
        """Start reading the connection: its sender is proven to run in ``job``."""
        self.open.add(conn)
        conn.job, conn.key = job, job.jobid
        assert self.selector is not None
        self.selector.register(conn.sock, selectors.EVENT_READ, conn)

    def resolve_pending(self, job_of_key: Callable[[str], tuple[str, str] | None] | None
                        ) -> None:
        """Attach the pending connections whose job is known now."""
        for conn in self._pending:
            try:
                found = job_of_key(conn.key) if job_of_key else None
            except Exception:
                found = None
            if found is not None:
                self._pending.discard(conn)
                self.attach(conn, JobIdentity(str(found[0]), str(found[1])))

    def take_overdue(self, now: float) -> list[Connection]:
        """Take out and return the pending connections past their time (still open: the
        caller refuses them)."""
        return self._pending.take_due(now)

    def mute(self, conn: Connection, until: float) -> None:
        """Stop reading the connection until then: its job is over its rate."""
        assert self.selector is not None
        self.selector.unregister(conn.sock)
        self._muted.add(conn, until)

    def unmute(self, now: float) -> None:
        """Read again the muted connections whose time has come."""
        assert self.selector is not None
        for conn in self._muted.take_due(now):
            if not conn.closed:
                self.selector.register(conn.sock, selectors.EVENT_READ, conn)

    def close_jobs(self, jobids: set[str]) -> None:
        """Close the connections attached to these jobs."""
        for conn in [c for c in self.open if c.job is not None and c.key in jobids]:
            self.close(conn)

    def close(self, conn: Connection) -> None:
        if conn.closed:
            return
        conn.closed = True
        self.open.discard(conn)
        # A muted or pending connection is not registered with the selector.
        if not self._muted.discard(conn) and not self._pending.discard(conn) and (
                self.selector is not None):
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(conn.sock)
        conn.sock.close()
