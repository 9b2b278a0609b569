"""The PromQL of a job's GPU slow-downs and errors, and what its answers mean.

Seven per-job counters (throttled seconds by reason, Xid counts and last times, ECC,
row remapping, PCIe replays, NVLink errors) are asked in one query, not seven: each
counter's series get an ``event`` label naming the counter (``label_replace``) and
the answers are joined with ``or``, so the report's query count grows by one (two with
the baseline) whatever the GPUs and errors.
"""

from __future__ import annotations

from collections.abc import Callable

from slurm_gpu_exporter.report.figures.gpu_events import FAULT_KINDS, GpuFault, Throttle
from slurm_gpu_exporter.report.prometheus.client import Sample

THROTTLED = "slurm_job_gpu_throttled_seconds_total"
XID_LAST = "slurm_job_gpu_xid_last_timestamp_seconds"
# event -> (the counter, the label that tells one series of it from another)
EVENTS = {
    "throttled": (THROTTLED, "reason"),
    "xid": ("slurm_job_gpu_xid_errors_total", "xid"),
    "ecc": ("slurm_job_gpu_ecc_errors_total", "type"),
    "remapped_rows": ("slurm_job_gpu_remapped_rows_total", "cause"),
    "pcie_replays": ("slurm_job_gpu_pcie_replays_total", ""),
    "nvlink": ("slurm_job_gpu_nvlink_errors_total", "kind"),
}
EVENT_LABEL = "event"
GPU_KEYS = ("jobid", "instance", "gpu", "uuid")

GpuKey = tuple[str, ...]


def _tagged(expr: str, event: str) -> str:
    return f'label_replace({expr}, "{EVENT_LABEL}", "{event}", "", "")'


def events_query(over: Callable[[str], str], with_last: bool = True) -> str:
    """The counters of EVENTS, each through ``over`` (a metric name to an instant-vector
    expression), tagged and joined; ``with_last`` adds the Xids' last times (their
    largest value in the window)."""
    parts = [_tagged(over(metric), event) for event, (metric, _) in EVENTS.items()]
    if with_last:
        parts.append(_tagged(over(XID_LAST), "xid_last"))
    return " or ".join(parts)


def _values(samples: list[Sample]) -> dict[tuple[GpuKey, str, str], float]:
    found = {}
    for s in samples:
        event = s.labels.get(EVENT_LABEL, "")
        if event not in EVENTS and event != "xid_last":
            continue
        label = EVENTS[event][1] if event in EVENTS else "xid"
        key = tuple(s.labels.get(k, "") for k in GPU_KEYS)
        found[key, event, s.labels.get(label, "") if label else ""] = s.value
    return found


def gpu_events(now: list[Sample], before: list[Sample]
               ) -> dict[GpuKey, tuple[list[Throttle], list[GpuFault]]]:
    """Per (jobid, instance, gpu, uuid): throttled seconds by reason and the errors, in
    the window (the value before it subtracted, where the answer has one)."""
    got, base = _values(now), _values(before)
    out: dict[GpuKey, tuple[list[Throttle], list[GpuFault]]] = {}
    for (gkey, event, detail), value in sorted(got.items()):
        if event == "xid_last":
            continue
        amount = max(0.0, value - base.get((gkey, event, detail), 0.0))
        throttled, faults = out.setdefault(gkey, ([], []))
        if event == "throttled":
            throttled.append(Throttle(detail, amount))
        elif amount > 0:
            last = got.get((gkey, "xid_last", detail)) if event == "xid" else None
            # To the millisecond: a long-term store keeps fewer bits of a Unix time than
            # Prometheus, and the archive must hold the same row from either.
            faults.append(GpuFault(event, detail, amount,
                                   None if last is None else round(last, 3)))
    for _, faults in out.values():  # Xids first, as the reports list them
        faults.sort(key=lambda f: (FAULT_KINDS.index(f.kind), f.detail))
    return out
