"""How many drains ``remediate`` may do in a sliding window (``--max-drains`` per
``--drain-window``): a flood of alerts, forged or from a broken rule, takes a few nodes
out of service, never the cluster. Kept in memory: a restart starts a new window."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class DrainBudget:
    max_drains: int = 2
    window_s: float = 3600.0
    _times: deque[float] = field(default_factory=deque)

    def used(self, now: float) -> int:
        """Drains in the window ending now."""
        while self._times and now - self._times[0] >= self.window_s:
            self._times.popleft()
        return len(self._times)

    def allows(self, now: float) -> bool:
        return self.used(now) < self.max_drains

    def spend(self, now: float) -> None:
        self._times.append(now)
