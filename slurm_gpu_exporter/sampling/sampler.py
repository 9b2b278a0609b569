"""The sampler: a background thread that builds one immutable snapshot per interval.

Each source (the job registry, cgroup statistics, the GPU backend, the training
relay, the state dir) is timed and fails alone: an exception in one leaves the
others' data in the snapshot and shows as that source's error count. A scrape never
waits for a sample; it serves the last one. The sampler hands each snapshot to
``publish`` and knows nothing of its rendering (web/server.py's holder renders it,
each format when a scrape first asks for it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from prometheus_client.metrics_core import Metric

from slurm_gpu_exporter.exposition.snapshot import (
    GpuSample,
    JobGpuSample,
    JobSample,
    NodeIdentity,
    Snapshot,
    SourceStatus,
    StepTiming,
    UnattributedSample,
)
from slurm_gpu_exporter.jobs.cpu_energy import CpuEnergyPart, CpuEnergySource
from slurm_gpu_exporter.jobs.job import Job
from slurm_gpu_exporter.jobs.node_energy import MeasuredParts, NodeEnergyPart, NodeEnergySource
from slurm_gpu_exporter.jobs.stats import JobStatsCollector
from slurm_gpu_exporter.jobs.tracker import JobTracker
from slurm_gpu_exporter.node.source_health import SOURCES, SourceErrors
from slurm_gpu_exporter.node.state_dir import StateStore
from slurm_gpu_exporter.training_relay.source import TrainingSource

log = logging.getLogger(__name__)


class GpuPart(Protocol):
    """What a GPU sampler adds to a snapshot."""

    nvml_up: bool
    job_gpus: tuple[JobGpuSample, ...]
    gpus: tuple[GpuSample, ...]
    unattributed: tuple[UnattributedSample, ...]


class GpuSource(Protocol):
    """What the sampler needs from the GPU side (gpu/sampler.py's GpuSampler)."""

    def sample(self, jobs: list[Job], now: float) -> GpuPart: ...
    def export_state(self) -> dict[str, Any]: ...
    def import_state(self, data: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class Sampler:
    """Runs the sources every ``interval`` seconds and publishes the snapshot."""

    def __init__(
        self,
        registry: JobTracker,
        jobstats: JobStatsCollector,
        errors: SourceErrors,
        interval: float,
        *,
        state: StateStore | None = None,
        gpu: GpuSource | None = None,
        training: TrainingSource | None = None,
        cpu_energy: CpuEnergySource | None = None,
        node_energy: NodeEnergySource | None = None,
        publish: Callable[[Snapshot], None] = lambda snapshot: None,
        clock: Callable[[], float] = time.time,
        identity: NodeIdentity | None = None,
    ) -> None:
        """``clock``: one wall clock per sample, the snapshot's timestamp and each source's now."""
        self.registry = registry
        self.jobstats = jobstats
        self.errors = errors
        self.interval = interval
        self.state = state
        self.gpu = gpu
        self.training = training
        self.cpu_energy = cpu_energy
        self.node_energy = node_energy
        self.publish = publish
        self.clock = clock
        self.identity = identity
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if state is not None:
            saved = state.load()
            try:
                jobstats.import_state(saved.get("jobs", {}))
                if gpu is not None:
                    gpu.import_state(saved.get("gpu", {}))
                if cpu_energy is not None:
                    cpu_energy.import_state(saved.get("cpu_energy", {}))
                if node_energy is not None:
                    node_energy.import_state(saved.get("node_energy", {}))
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
        if self.gpu is not None:
            self.gpu.close()

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
            self._wait_reading_buffers(next_at)

    def _wait_reading_buffers(self, until: float) -> None:
        """Wait until ``until`` (monotonic s); meanwhile read the GPUs' sample buffers as
        often as they need, so that a long interval loses none to the driver's buffer."""
        every = getattr(self.gpu, "buffer_read_interval", None)
        while True:
            gap = every() if every is not None else None
            left = until - time.monotonic()
            if gap is None or gap >= left:
                self._stop.wait(max(0.0, left))
                return
            if self._stop.wait(gap):
                return
            try:
                self.gpu.read_buffers()  # type: ignore[union-attr]
            except Exception:  # as a failed sample: the next one reads on
                log.exception("reading the GPU sample buffers failed")

    def sample_once(self) -> Snapshot:
        """Take one sample, save state and publish it; returns the snapshot."""
        started = time.monotonic()  # for the sample's own duration only
        now = self.clock()
        self.errors.take_failed()  # what failed between samples is not this sample's
        steps: list[StepTiming] = []

        refreshed: list[Job] | None = self._timed("registry", steps,
                                                  lambda: self.registry.refresh(now), None)
        jobs = refreshed if refreshed is not None else []
        job_samples: list[JobSample] = self._timed(
            "cgroup", steps, lambda: self.jobstats.collect(jobs), [])
        energy: CpuEnergyPart | None = None
        if self.cpu_energy is not None:
            energy = self._timed("powercap", steps,
                                 lambda: self.cpu_energy.sample(job_samples),  # type: ignore[union-attr]
                                 CpuEnergyPart(up=False))
        gpu_part: GpuPart | None = None
        if self.gpu is not None:
            gpu_part = self._timed("nvml", steps, lambda: self.gpu.sample(jobs, now), None)  # type: ignore[union-attr]
        node: NodeEnergyPart | None = None
        if self.node_energy is not None:
            node = self._timed("nodepower", steps, lambda: self.node_energy.sample(  # type: ignore[union-attr]
                now, [s.job for s in job_samples], _measured(gpu_part, energy)),
                NodeEnergyPart(up=False))
        training: tuple[Metric, ...] = ()
        if self.training is not None:
            # Without the registry's answer nothing is forgotten (None, not []).
            training = self._timed("training", steps,
                                   lambda: self.training.sample(refreshed), ())  # type: ignore[union-attr]
        if self.state is not None:
            self._timed("state", steps, self._save_state, None)

        nvml_up = (gpu_part is not None and gpu_part.nvml_up) if self.gpu is not None else None
        failed = self.errors.take_failed()
        snapshot = Snapshot(
            timestamp=now,
            jobs=tuple(job_samples),
            job_gpus=gpu_part.job_gpus if gpu_part else (),
            gpus=gpu_part.gpus if gpu_part else (),
            unattributed=gpu_part.unattributed if gpu_part else (),
            nvml_up=nvml_up,
            sources=self._source_statuses(failed, nvml_up,
                                          energy.up if energy is not None else None,
                                          node.up if node is not None else None),
            steps=tuple(steps),
            errors=self.errors.snapshot(),
            sample_duration_seconds=time.monotonic() - started,
            training=training,
            powercap_up=energy.up if energy is not None else None,
            job_cpu_energy=energy.jobs if energy is not None else (),
            cpu_energy=energy.sockets if energy is not None else (),
            cpu_energy_outside_jobs=energy.outside_jobs if energy is not None else (),
            **_node_fields(node),
            identity=self.identity,
        )
        self.publish(snapshot)
        return snapshot

    def _source_statuses(self, failed: frozenset[str], nvml_up: bool | None,
                         powercap_up: bool | None = None,
                         nodepower_up: bool | None = None) -> tuple[SourceStatus, ...]:
        """A source is up when it counted no error of its own in this sample; NVML also
        needs nvml_up (a missing library is counted only when a re-initialisation is tried),
        powercap its zones found and read."""
        statuses = []
        for source in SOURCES:
            if ((source == "nvml" and nvml_up is None)
                    or (source == "state" and self.state is None)
                    or (source == "training" and self.training is None)
                    or (source == "powercap" and powercap_up is None)
                    or (source == "nodepower" and nodepower_up is None)):
                continue  # not collected at all
            ok = source not in failed
            if source == "nvml":
                ok = ok and bool(nvml_up)
            if source == "powercap":
                ok = ok and bool(powercap_up)
            if source == "nodepower":
                ok = ok and bool(nodepower_up)
            statuses.append(SourceStatus(source, ok))
        return tuple(statuses)

    def _timed(self, name: str, steps: list[StepTiming], fn: Callable[[], Any],
               fallback: Any) -> Any:
        t0 = time.monotonic()
        try:
            result = fn()
        except Exception as exc:
            log.exception("sampling step %s failed", name)
            self.errors.count(_STEP_SOURCE[name], f"{name} failed: {exc}", log_it=False)
            result = fallback
        steps.append(StepTiming(name, time.monotonic() - t0))
        return result

    def _save_state(self) -> None:
        assert self.state is not None
        data: dict[str, Any] = {"jobs": self.jobstats.export_state()}
        if self.gpu is not None:
            data["gpu"] = self.gpu.export_state()
        if self.cpu_energy is not None:
            data["cpu_energy"] = self.cpu_energy.export_state()
        if self.node_energy is not None:
            data["node_energy"] = self.node_energy.export_state()
        try:
            self.state.save(data, *_cursors_may_wait(self.gpu, data))
        except OSError as exc:
            self.errors.count("state", f"cannot save state to {self.state.path}: "
                              f"{exc.strerror}; a restart may reset counters")


# The error source a step's own crash is counted under: the registry's first job is
# the spool, so a crash there shows as a spool problem.
_STEP_SOURCE = {"registry": "spool", "cgroup": "cgroup", "nvml": "nvml", "state": "state",
                "training": "training", "powercap": "powercap", "nodepower": "nodepower"}


def _cursors_may_wait(gpu: object, data: dict[str, Any]
                      ) -> tuple[tuple[str, str] | None, float]:
    """(where the GPUs' sample cursors are in the state, how long a change of those
    alone may wait to be written): half the drivers' buffer span, two buffer-read
    intervals. A restart then reads on from an older cursor and finds every sample since
    it still in the buffer, so it counts what it would have counted. (None, 0) where no
    GPU has sample buffers."""
    every = getattr(gpu, "buffer_read_interval", None)
    read_interval = every() if every is not None else None
    if not read_interval or "sample_cursors" not in data.get("gpu", {}):
        return None, 0.0
    return ("gpu", "sample_cursors"), 2 * read_interval


def _measured(gpu_part: GpuPart | None, energy: CpuEnergyPart | None) -> MeasuredParts:
    """What the GPUs and RAPL measured in this sample, for sharing the node's energy."""
    return MeasuredParts(job_gpu=gpu_part.job_gpus if gpu_part else (),
                         gpus=gpu_part.gpus if gpu_part else (),
                         job_cpu=energy.jobs if energy else (),
                         cpu=energy.sockets if energy else ())


def _node_fields(node: NodeEnergyPart | None) -> dict[str, Any]:
    """The snapshot's node power fields (none where no meter is configured)."""
    if node is None:
        return {}
    return {"node_power_up": node.up, "node_power_watts": node.power_watts,
            "node_energy_joules": node.energy_joules, "job_node_energy": node.jobs,
            "node_energy_outside_jobs": node.outside_jobs_joules}
