"""A job's GPU slow-downs and errors as the reports say them: per GPU, the throttled
share by reason (of the time the GPU was busy and of the time it was held), the GPU
the notes name, and one line per error kind."""

from __future__ import annotations

from collections.abc import Iterator

from slurm_gpu_exporter.report.figures.gpu_events import (
    SLOWING,
    WORDING,
    GpuFault,
    Slowdown,
    reason_order,
    share,
)
from slurm_gpu_exporter.report.figures.shapes import GpuDetail, JobDetail

# A reason is listed for a GPU from this share of its held time on (0.5 %): less is noise.
SHOWN_FROM = 0.005


def gpu_name(detail: JobDetail, node: str, gpu: str) -> str:
    """``3``, or ``3 on node7`` where the job ran on several nodes."""
    return f"{gpu} on {node}" if len(detail.nodes) > 1 else gpu


def _gpus(detail: JobDetail) -> Iterator[tuple[str, GpuDetail]]:
    for node in detail.nodes:
        for gpu in node.gpus:
            yield gpu_name(detail, node.node, gpu.gpu), gpu


def throttle_shares(gpu: GpuDetail) -> list[tuple[str, float | None, float]]:
    """(reason, share of busy time, share of held time) of the reasons worth listing;
    the busy share only for the reasons that slow a busy GPU (SLOWING)."""
    held = gpu.allocated_s + (gpu.unknown_s or 0.0)
    rows = []
    for t in sorted(gpu.throttled, key=lambda t: reason_order(t.reason)):
        held_ratio = share(t.seconds, held)
        if held_ratio is None or held_ratio < SHOWN_FROM:
            continue
        busy = share(t.seconds, gpu.busy_s) if t.reason in SLOWING else None
        rows.append((t.reason, busy, held_ratio))
    return rows


def throttle_lines(detail: JobDetail) -> list[tuple[str, str]]:
    """``("3", "power-capped 23% of its busy time (12% of the time held)")`` per GPU
    with a reason worth listing."""
    lines = []
    for name, gpu in _gpus(detail):
        parts = []
        for reason, busy, held in throttle_shares(gpu):
            words = WORDING.get(reason, reason)
            parts.append(f"{words} {busy:.0%} of its busy time ({held:.0%} of the time held)"
                         if busy is not None else f"{words} {held:.0%} of the time held")
        if parts:
            lines.append((name, "; ".join(parts)))
    return lines


def slowdown(detail: JobDetail) -> Slowdown | None:
    """The largest share of busy time one slowing reason took on one GPU; None where no
    GPU reports a slowing reason or none was busy."""
    best: Slowdown | None = None
    for name, gpu in _gpus(detail):
        for t in gpu.throttled:
            busy = share(t.seconds, gpu.busy_s)
            if t.reason not in SLOWING or busy is None:
                continue
            if best is None or busy > best.busy_ratio:
                held = share(t.seconds, gpu.allocated_s + (gpu.unknown_s or 0.0))
                best = Slowdown(name, t.reason, busy, held)
    return best


def faults(detail: JobDetail) -> list[tuple[str, GpuFault]]:
    """Every error a GPU reported while the job held it, Xids first in time order."""
    found = [(name, f) for name, gpu in _gpus(detail) for f in gpu.faults if f.count > 0]
    return sorted(found, key=lambda p: (p[1].kind != "xid", p[1].last or 0.0))


def fault_lines(detail: JobDetail) -> list[str]:
    """``Xid 79 at 14:03 UTC on GPU 1`` and the like, one per GPU, kind and code."""
    return [fault.text(name) for name, fault in faults(detail)]


def xid_errors(detail: JobDetail) -> float | None:
    """The job's Xid count; None where no GPU has a series of either kind (an agent
    from before it counted them)."""
    if not any(gpu.faults or gpu.throttled for _, gpu in _gpus(detail)):
        return None
    return sum(f.count for _, f in faults(detail) if f.kind == "xid")
