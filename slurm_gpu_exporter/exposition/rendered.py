"""One snapshot's exposition: the bodies a scrape is served, each rendered once.

``render`` wraps one sample's snapshot in an Exposition, which renders a format (text
or OpenMetrics, plain or gzip) the first time a scrape asks for it and serves those
bytes to every later scrape of the same snapshot. The families come from
``exposition/metrics.py``, which names them all.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterable

from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import Collector

from slurm_gpu_exporter.exposition.labels import bound_label_values
from slurm_gpu_exporter.exposition.metrics import SnapshotCollector
from slurm_gpu_exporter.exposition.own_process import OwnProcess, ProcessReading
from slurm_gpu_exporter.exposition.snapshot import Snapshot


class Exposition:
    """One snapshot, rendered in a format only when a scrape asks for that format.

    Each of the four bodies (text or OpenMetrics, plain or gzip) is made at most once,
    by the first caller that wants it; callers that ask meanwhile wait for that render
    rather than doing their own. The families are collected once and shared by both
    formats. Most samples are never scraped (5 s samples, 30 s scrapes): rendering
    them all cost more than the sample itself. Thread-safe.
    """

    def __init__(self, snapshot: Snapshot, extra: Iterable[Collector] = ()) -> None:
        self.snapshot = snapshot
        self.timestamp = snapshot.timestamp
        self._extra = tuple(extra)
        self._lock = threading.Lock()
        self._families: list[Metric] | None = None
        self._bodies: dict[tuple[bool, bool], bytes] = {}
        # How many times a format was generated and a body compressed (for tests).
        self.renders = 0
        self.compressions = 0

    def cached(self, openmetrics: bool, gzipped: bool) -> bytes | None:
        """The body if it was already rendered, else None (never renders)."""
        return self._bodies.get((openmetrics, gzipped))

    def body(self, openmetrics: bool, gzipped: bool) -> bytes:
        """The body in one format, rendered now if nobody asked for it before."""
        key = (openmetrics, gzipped)
        body = self._bodies.get(key)
        if body is not None:
            return body
        with self._lock:
            body = self._bodies.get(key)
            if body is None:
                body = self._render(openmetrics, gzipped)
        return body

    def _render(self, openmetrics: bool, gzipped: bool) -> bytes:
        """Called with the lock held."""
        if gzipped:
            plain = self._bodies.get((openmetrics, False))
            if plain is None:
                plain = self._render(openmetrics, False)
            body = gzip.compress(plain, compresslevel=6, mtime=0)
            self.compressions += 1
        else:
            if self._families is None:
                self._families = [bound_label_values(family) for family in
                                  SnapshotCollector(self.snapshot, self._extra).collect()]
            collected = _Collected(self._families)
            generate = generate_openmetrics if openmetrics else generate_latest
            body = generate(collected)  # type: ignore[arg-type]
            self.renders += 1
        self._bodies[(openmetrics, gzipped)] = body
        return body

    @property
    def text(self) -> bytes:
        return self.body(openmetrics=False, gzipped=False)

    @property
    def text_gzip(self) -> bytes:
        return self.body(openmetrics=False, gzipped=True)

    @property
    def openmetrics(self) -> bytes:
        return self.body(openmetrics=True, gzipped=False)

    @property
    def openmetrics_gzip(self) -> bytes:
        return self.body(openmetrics=True, gzipped=True)


# The agent's own RSS, CPU and open files, read from the real /proc/self (not
# --proc-root) by render(), in the sampler's thread: a scrape reads nothing.
_PROCESS_COLLECTOR = OwnProcess()


class _OwnFigures:
    """One read of the process figures, made into families when first collected."""

    def __init__(self, reading: ProcessReading | None) -> None:
        self.reading = reading

    def collect(self) -> list[Metric]:
        return _PROCESS_COLLECTOR.families(self.reading)


class _Collected:
    """Families collected once, handed to both exposition writers."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def render(snapshot: Snapshot) -> Exposition:
    """The exposition of a snapshot; each format is rendered when first asked for.

    Called by the sampler: the agent's own process figures are read now, with the
    sample, so that serving the exposition later touches no file.
    """
    return Exposition(snapshot, (_OwnFigures(_PROCESS_COLLECTOR.read()),))
