"""GPM activity into counters: per GPU (or MIG instance), and for the one job that has it.

Each activity fraction (SM active, SM occupancy, tensor, DRAM, FP64/32/16) is
integrated over the interval it covers, so a counter divided by allocated seconds
over a job's life is the job's mean. GPM measures a whole GPU or a whole MIG GPU
instance and cannot be split between jobs: a job gets the figures only where it is
the sole job on the target and no process outside every job is on it. A GPU shared
by several jobs (sharding, MPS, oversubscription) gets device series only.

Pure arithmetic and bookkeeping: nothing here reads a device or a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from slurm_gpu_exporter.gpu.readings import GpmFigures

Totals = tuple[tuple[str, float], ...]  # (name, total), sorted by name


def sole_job(jobids: Iterable[str], outside: bool) -> str | None:
    """The job a target's activity belongs to: the only job using or holding it, with
    no process outside every job on it; None when it is shared (or idle)."""
    ids = set(jobids)
    return next(iter(ids)) if len(ids) == 1 and not outside else None


def job_activity(figures: GpmFigures, start: float | None, now: float) -> dict[str, float]:
    """Seconds of each activity in the interval ending at ``now``; for a job that started
    within it, only the part since its start (as busy time is trimmed)."""
    span = figures.seconds
    if start is not None:
        span = min(span, max(0.0, now - start))
    return {name: fraction * span for name, fraction in figures.activity.items()}


def _add(totals: dict[str, float], amounts: Mapping[str, float]) -> None:
    for name, amount in amounts.items():
        totals[name] = totals.get(name, 0.0) + amount


def _sorted(totals: Mapping[str, float] | None) -> Totals:
    return tuple(sorted((totals or {}).items()))


class DeviceActivity:
    """Per GPU or MIG instance (by UUID): activity seconds and traffic bytes since the
    agent first saw GPM figures for it; kept in the state dir."""

    def __init__(self) -> None:
        self.activity: dict[str, dict[str, float]] = {}
        self.traffic: dict[str, dict[str, float]] = {}

    def add(self, uuid: str, figures: GpmFigures | None) -> None:
        """Count one interval's figures (None: nothing this time, totals stay)."""
        if figures is None:
            return
        _add(self.activity.setdefault(uuid, {}),
             {n: f * figures.seconds for n, f in figures.activity.items()})
        _add(self.traffic.setdefault(uuid, {}),
             {n: rate * figures.seconds for n, rate in figures.traffic.items()})

    def of(self, uuid: str) -> tuple[Totals, Totals]:
        """(activity seconds, traffic bytes) of one target, sorted by name."""
        return _sorted(self.activity.get(uuid)), _sorted(self.traffic.get(uuid))

    def prune(self, present: set[str]) -> None:
        for totals in (self.activity, self.traffic):
            for uuid in [u for u in totals if u not in present]:
                del totals[uuid]

    def export_state(self) -> dict[str, Any]:
        return {"gpm_activity": self.activity, "gpm_traffic": self.traffic}

    def import_state(self, data: dict[str, Any]) -> None:
        for key, totals in (("gpm_activity", self.activity), ("gpm_traffic", self.traffic)):
            saved = data.get(key)
            for uuid, per in (saved.items() if isinstance(saved, dict) else ()):
                if isinstance(per, dict):
                    totals[str(uuid)] = {str(n): float(v) for n, v in per.items()
                                         if isinstance(v, int | float)}
