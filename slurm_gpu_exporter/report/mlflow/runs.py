"""Which runs get which job's figures: the runs waiting for them, and the checks a run
passes before its job's figures go in. Pure: no I/O.

A run names its job through tags its own user can write (``slurm.job_id``), so a tag
alone proves nothing: the figures go in only when the run's MLflow ``user_id`` is the
job's Slurm user, the job ended in the window and, with ``--cluster``, the run names
that cluster. A run whose job is not (yet) known stays pending; a run that claims
another user's job is marked refused, so it is not looked at again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slurm_gpu_exporter.model.ids import is_job_id
from slurm_gpu_exporter.report.figures.shapes import JobDetail
from slurm_gpu_exporter.report.figures.window import Window

TAG_JOB_ID = "slurm.job_id"
TAG_CLUSTER = "slurm.cluster"
TAG_FIGURES = "slurm.figures"
PENDING = "pending"
WRITTEN = "written"
REFUSED = "refused"
TAG_REFUSED_WHY = "slurm.figures_refused"
# The runs to look at: those the training client tagged and nobody filled yet.
PENDING_FILTER = f"tags.`{TAG_FIGURES}` = '{PENDING}'"


@dataclass(frozen=True)
class PendingRun:
    """A run waiting for its job's figures, as MLflow described it."""

    run_id: str
    experiment_id: str
    user_id: str
    job_id: str
    cluster: str


@dataclass(frozen=True)
class Verdict:
    """What to do with one run: ``write``, ``refuse`` (marked, never again) or ``wait``
    (left pending: the job runs, or is not known here yet); ``why`` says it in words."""

    action: str
    why: str


def pending_run(run: dict[str, Any]) -> PendingRun | None:
    """The run if it names a plain Slurm job id; None for a run of any other shape."""
    info = run.get("info") or {}
    tags = {t.get("key"): t.get("value") for t in (run.get("data") or {}).get("tags", [])
            if isinstance(t, dict)}
    job_id = str(tags.get(TAG_JOB_ID) or "")
    run_id = str(info.get("run_id") or info.get("run_uuid") or "")
    if not run_id or not is_job_id(job_id) or tags.get(TAG_FIGURES) != PENDING:
        return None
    return PendingRun(run_id=run_id, experiment_id=str(info.get("experiment_id", "")),
                      user_id=str(info.get("user_id") or ""), job_id=job_id,
                      cluster=str(tags.get(TAG_CLUSTER) or ""))


def for_cluster(run: PendingRun, cluster: str | None) -> bool:
    """Whether the run is this invocation's: any run without ``--cluster``, else only
    the runs that name that cluster (another cluster's writer fills the others)."""
    return cluster is None or run.cluster == cluster


def verdict(run: PendingRun, detail: JobDetail | None, window: Window) -> Verdict:
    """Whether ``run`` gets the figures of ``detail`` (None: Prometheus does not know
    the job)."""
    if detail is None:
        return Verdict("wait", f"job {run.job_id} has no metrics in Prometheus")
    if detail.running:
        return Verdict("wait", f"job {run.job_id} is still running")
    end = detail.end
    if end is None or not window.start <= end <= window.end:
        return Verdict("wait", f"job {run.job_id} did not end in the window")
    if not run.user_id or run.user_id != detail.usage.user:
        return Verdict("refuse", f"the run's user {run.user_id or '(none)'} is not job "
                                 f"{run.job_id}'s user {detail.usage.user or '(unknown)'}")
    return Verdict("write", f"job {run.job_id} ended")
