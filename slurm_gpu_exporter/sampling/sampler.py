"""The sampler: a background thread that builds one immutable snapshot per interval.

It runs the sources the agent built (agent/sources.py), in their order, each with the
parts of those before it (jobs/source.py's protocol). Each is timed and fails alone: an
exception in one leaves the others' data in the snapshot and shows as that source's
error count. A scrape never waits for a sample; it serves the last one. The sampler
hands each snapshot to ``publish`` and knows nothing of its rendering (web/server.py's
holder renders it, each format when a scrape first asks for it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from slurm_gpu_exporter.exposition.snapshot import (
    NodeIdentity,
    Snapshot,
    SourceStatus,
    StepTiming,
)
from slurm_gpu_exporter.jobs.source import ReadsBetweenSamples, SampleContext, SampleSource
from slurm_gpu_exporter.node.source_health import SOURCES, SourceErrors
from slurm_gpu_exporter.node.state_dir import StateStore

log = logging.getLogger(__name__)

STATE_STEP = "state"  # the step that saves every source's state, and its health name


class Sampler:
    """Runs the sources every ``interval`` seconds and publishes the snapshot."""

    def __init__(
        self,
        sources: Sequence[SampleSource],
        errors: SourceErrors,
        interval: float,
        *,
        state: StateStore | None = None,
        publish: Callable[[Snapshot], None] = lambda snapshot: None,
        clock: Callable[[], float] = time.time,
        identity: NodeIdentity | None = None,
    ) -> None:
        """``clock``: one wall clock per sample, the snapshot's timestamp and each source's now."""
        names = [s.name for s in sources]
        if len(set(names)) != len(names) or STATE_STEP in names:
            raise ValueError(f"source names must be unique and not {STATE_STEP!r}: {names}")
        self.sources = tuple(sources)
        # Once: a check against a runtime protocol walks its attributes each time.
        self._readers = [s for s in self.sources if isinstance(s, ReadsBetweenSamples)]
        self.errors = errors
        self.interval = interval
        self.state = state
        self.publish = publish
        self.clock = clock
        self.identity = identity
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if state is not None:
            self._restore(state)

    def source(self, name: str) -> SampleSource:
        """The source of that name (tests, benchmarks)."""
        return next(s for s in self.sources if s.name == name)

    def _restore(self, state: StateStore) -> None:
        saved = state.load()
        try:
            for source in self.sources:
                if source.state_key is not None:
                    source.import_state(saved.get(source.state_key, {}))
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
            # Of the wrong shape deeper down: never a reason not to start.
            state.move_aside(f"{type(exc).__name__}: {exc}")

    def start(self) -> None:
        """Take the first sample now, then keep sampling in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        for source in self.sources:
            source.close()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception:  # a bug must not end sampling; the snapshot age shows it
                log.exception("sample failed; serving the previous snapshot")
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (slow NVML?): skip missed ticks, keep the cadence
                next_at = time.monotonic()
                delay = 0
            self._wait_reading_between(next_at)

    def _wait_reading_between(self, until: float) -> None:
        """Wait until ``until`` (monotonic s); meanwhile let the sources that must read
        between samples (the GPUs' sample buffers) read as often as they need, so that a
        long interval loses nothing to the driver's buffer."""
        readers = self._readers
        due = {id(r): time.monotonic() for r in readers}
        while True:
            now = time.monotonic()
            next_read, reader = until, None
            for r in readers:
                gap = r.between_samples()
                if gap is not None and due[id(r)] + gap < next_read:
                    next_read, reader = due[id(r)] + gap, r
            if reader is None:
                self._stop.wait(max(0.0, until - now))
                return
            if self._stop.wait(max(0.0, next_read - now)):
                return
            due[id(reader)] = time.monotonic()
            try:
                reader.read_between()
            except Exception:  # as a failed sample: the next one reads on
                log.exception("reading between samples failed")

    def sample_once(self) -> Snapshot:
        """Take one sample, save state and publish it; returns the snapshot."""
        started = time.monotonic()  # for the sample's own duration only
        ctx = SampleContext(now=self.clock())
        self.errors.take_failed()  # what failed between samples is not this sample's
        steps: list[StepTiming] = []
        fields: dict[str, Any] = {}
        for source in self.sources:
            part = self._timed(source.name, source.health_names[0], steps,
                               lambda s=source: s.take(ctx), source.failed_part)
            ctx.parts[source.name] = part
            fields.update(source.snapshot_fields(part))
        if self.state is not None:
            self._timed(STATE_STEP, STATE_STEP, steps, self._save_state, lambda: None)

        failed = self.errors.take_failed()
        snapshot = Snapshot(
            timestamp=ctx.now,
            sources=self._source_statuses(failed, ctx),
            steps=tuple(steps),
            errors=self.errors.snapshot(),
            sample_duration_seconds=time.monotonic() - started,
            identity=self.identity,
            **fields,
        )
        self.publish(snapshot)
        return snapshot

    def _source_statuses(self, failed: frozenset[str], ctx: SampleContext
                         ) -> tuple[SourceStatus, ...]:
        """A source is up when it counted no error of its own in this sample and its part
        is good (NVML initialised, RAPL zones found and read, the meter read); a source
        not configured is not listed. In SOURCES order."""
        ok: dict[str, bool] = {}
        for source in self.sources:
            good = source.up(ctx.parts[source.name])
            for name in source.health_names:
                ok[name] = good and name not in failed
        if self.state is not None:
            ok[STATE_STEP] = STATE_STEP not in failed
        return tuple(SourceStatus(name, ok[name]) for name in SOURCES if name in ok)

    def _timed(self, name: str, health: str, steps: list[StepTiming],
               fn: Callable[[], Any], fallback: Callable[[], Any]) -> Any:
        t0 = time.monotonic()
        try:
            result = fn()
        except Exception as exc:
            log.exception("sampling step %s failed", name)
            self.errors.count(health, f"{name} failed: {exc}", log_it=False)
            result = fallback()
        steps.append(StepTiming(name, time.monotonic() - t0))
        return result

    def _save_state(self) -> None:
        assert self.state is not None
        data: dict[str, Any] = {s.state_key: s.export_state() for s in self.sources
                                if s.state_key is not None}
        try:
            self.state.save(data, *self._lazy_state(data))
        except OSError as exc:
            self.errors.count("state", f"cannot save state to {self.state.path}: "
                              f"{exc.strerror}; a restart may reset counters")

    def _lazy_state(self, data: dict[str, Any]) -> tuple[tuple[str, str] | None, float]:
        """(where in the state a part may be written late, how late): the GPUs' sample
        cursors, at most half the drivers' buffer span late. A restart then reads on from
        an older cursor and finds every sample since it still in the buffer. (None, 0)
        where nothing may wait."""
        for reader in self._readers:
            lazy = reader.lazy_state()
            key = getattr(reader, "state_key", None)
            if lazy is not None and key is not None and lazy[0] in data.get(key, {}):
                return (key, lazy[0]), lazy[1]
        return None, 0.0
