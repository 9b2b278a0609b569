"""Per-source error accounting: every problem is counted, and logged without flooding.

Each data source in ``SOURCES`` fails alone and shows up as
``slurm_gpu_exporter_sample_errors_total{source=...}`` and
``slurm_gpu_exporter_source_up{source=...}``: the two families share these label
values, and counting under any other name is refused. A message that repeats is
logged once per ``quiet_period`` seconds, with how often it recurred.

Each source counts its own problems under its own name (the spool reader under
``spool``, the cgroup readers under ``cgroup``, the Slurm look-ups under ``slurm``,
the GPU part under ``nvml``, the state store under ``state``, the training relay's
refusals under ``training``, the RAPL reader under ``powercap``, the node power meter
under ``nodepower``); a source is up in a sample when it counted nothing during it,
so one source never marks another down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("slurm_gpu_exporter")

# The one set of `source` label values (docs/metrics.md lists them with their meaning).
SOURCES = ("spool", "cgroup", "slurm", "nvml", "state", "training", "powercap",
           "nodepower")


class SourceErrors:
    """Error counters by source (monotonic for the agent's life) with rate-limited logging."""

    def __init__(self, quiet_period: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.quiet_period = quiet_period
        self.clock = clock
        self._lock = threading.Lock()
        self._counts: dict[str, int] = dict.fromkeys(SOURCES, 0)
        self._failed: set[str] = set()  # sources that counted since take_failed()
        # message -> (time last logged, repeats since then)
        self._logged: dict[str, tuple[float, int]] = {}

    def count(self, source: str, message: str, *, log_it: bool = True, n: int = 1) -> None:
        """Count ``n`` errors of ``source``; log ``message`` unless it was logged recently."""
        if source not in self._counts:
            raise ValueError(f"unknown error source {source!r}; add it to source_health.SOURCES")
        with self._lock:
            self._counts[source] += n
            self._failed.add(source)
            if not log_it:
                return
            now = self.clock()
            last = self._logged.get(message)
            if last is not None and now - last[0] < self.quiet_period:
                self._logged[message] = (last[0], last[1] + 1)
                return
            repeats = last[1] if last else 0
            self._logged[message] = (now, 0)
            if len(self._logged) > 1000:  # bound memory on ever-changing messages
                self._logged.clear()
        suffix = f" (and {repeats} more times since last logged)" if repeats else ""
        log.warning("%s: %s%s", source, message, suffix)

    def take_failed(self) -> frozenset[str]:
        """The sources that counted an error since the last call; starts a new period."""
        with self._lock:
            failed = frozenset(self._failed)
            self._failed.clear()
        return failed

    def snapshot(self) -> dict[str, int]:
        """A copy of the counters."""
        with self._lock:
            return dict(self._counts)
