"""Which jobs hold a faulty GPU, as Prometheus shows it: the source of ``requeue`` that
is not Slurm.

The agent's per-job-per-GPU series carry ``jobid``, ``gpu`` (the NVML index, or
``<parent>.<GPU instance>`` for a MIG instance) and ``uuid``; the GPU alerts carry the
device's ``gpu`` and ``uuid`` and the target's labels (``instance``, ``job``, and the
site's ``cluster`` or node label). One query per alert target asks for the time of the
last sample of each job's allocation series there; a job holds the faulty GPU when its
series names that GPU (by index and, where the alert gives one, by UUID; a MIG instance
of it too) and its last sample is fresh. A series that ended (the job left the GPU)
carries Prometheus' stale marker and is not returned at all.
"""

from __future__ import annotations

from collections.abc import Iterable

from slurm_gpu_exporter.model.ids import is_job_id
from slurm_gpu_exporter.report.prometheus.client import Sample
from slurm_gpu_exporter.report.prometheus.queries import selector
from slurm_gpu_exporter.report.remediate.confirm import TARGET_LABEL, Episode

HOLDER_METRIC = "slurm_job_gpu_allocated_seconds_total"
# The labels a scrape puts on every series of a target: what ties the job series to the
# alert's target (never the GPU's own labels, which are matched in Python).
TARGET_LABELS = (TARGET_LABEL, "job", "cluster")
# A job series whose last sample is older than this holds nothing any more.
FRESH_S = 120.0


def holders_query(episode: Episode, node_label: str | None) -> str | None:
    """``timestamp(slurm_job_gpu_allocated_seconds_total{<the alert's target>})``, or
    None where the alert names no target (then no job is ever picked)."""
    names = (*TARGET_LABELS, node_label) if node_label else TARGET_LABELS
    match = {name: episode.label(name) for name in names if episode.label(name)}
    if TARGET_LABEL not in match and not (node_label and node_label in match):
        return None
    return f"timestamp({selector(HOLDER_METRIC, match)})"


def holds(series: dict[str, str], episode: Episode) -> bool:
    """Whether a job series names the alert's GPU: the same index (and UUID where the
    alert gives one: an index alone could be another device after a re-enumeration),
    or a MIG instance of it; an alert that names no GPU names no job."""
    gpu, uuid = episode.label("gpu"), episode.label("uuid")
    if not gpu:
        return bool(uuid) and series.get("uuid") == uuid
    if series.get("gpu") == gpu:
        return not uuid or series.get("uuid") == uuid
    # A MIG instance "3.1" lives on GPU 3: a fault of the GPU is a fault of each.
    return "." not in gpu and series.get("gpu", "").startswith(gpu + ".")


def holders(samples: Iterable[Sample], episode: Episode, now: float,
            fresh_s: float = FRESH_S) -> set[str]:
    """The job ids (the agent's ``jobid``: each job's own id) whose fresh series hold
    the alert's GPU."""
    return {s.labels["jobid"] for s in samples
            if is_job_id(s.labels.get("jobid", "")) and holds(s.labels, episode)
            and now - s.value <= fresh_s}
