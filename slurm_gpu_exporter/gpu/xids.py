"""Xid events counted per GPU: written by the Xid thread (gpu/polling.py), read by the
attribution (gpu/attribution/job_errors.py); it imports neither."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class XidCounts:
    """Xid events per GPU and code, counted by the Xid thread, read by the sampler; and
    each GPU's events not yet given to jobs (gpu/attribution/job_errors.py takes them each poll)."""

    PENDING_MAX = 1000  # per GPU: an Xid storm while no poll takes them costs bounded memory

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int], int] = {}
        self._pending: dict[str, list[tuple[int, float]]] = {}
        self._clock = clock

    def add(self, uuid: str, xid: int, at: float = 0.0) -> None:
        with self._lock:
            self._counts[(uuid, xid)] = self._counts.get((uuid, xid), 0) + 1
            pending = self._pending.setdefault(uuid, [])
            if len(pending) < self.PENDING_MAX:
                pending.append((xid, at or self._clock()))

    def of(self, uuid: str) -> tuple[tuple[int, int], ...]:
        """(Xid, count) pairs of one GPU, by Xid."""
        with self._lock:
            return tuple(sorted((x, n) for (u, x), n in self._counts.items() if u == uuid))

    def take(self, uuid: str) -> list[tuple[int, float]]:
        """The GPU's (Xid, wall time) events since the last take, oldest first."""
        with self._lock:
            return self._pending.pop(uuid, [])

    def prune(self, present: set[str]) -> None:
        with self._lock:
            for key in [k for k in self._counts if k[0] not in present]:
                del self._counts[key]
            for uuid in [u for u in self._pending if u not in present]:
                del self._pending[uuid]
