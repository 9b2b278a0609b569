"""Who may connect to the relay: the sender's pid and uid from the kernel (SO_PEERCRED),
its job from the injected ``job_of_pid``, and the caps on connections per job, per user
and in all; a uid refused too often is refused without a look-up."""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

from slurm_gpu_exporter.training_relay.connections import Connection
from slurm_gpu_exporter.training_relay.limits import RelayLimits
from slurm_gpu_exporter.training_relay.store import TrainingStore

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class PendingJob:
    """``job_of_pid``'s answer for a process in the cgroup of a job the agent does not
    know yet: ``key`` is the job's cgroup key (a job id, or a SLUID), asked of
    ``job_of_key`` again until it names the job or ``limits.pending_seconds`` pass."""

    key: str


JobOfPid = Callable[[int], "tuple[str, str] | PendingJob | None"]
JobOfKey = Callable[[str], "tuple[str, str] | None"]


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


class Admission:
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

    def admit(self, sock: socket.socket, connections: set[Connection], now: float
              ) -> tuple[Connection, tuple[str, str] | PendingJob] | None:
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
        return Connection(sock, pid, uid, None, key), found

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


