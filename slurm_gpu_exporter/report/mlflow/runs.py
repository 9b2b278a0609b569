"""Which runs get which job's figures: the runs waiting for them, and the checks a run
passes before its job's figures go in. Pure: no I/O.

What a run says of itself proves nothing: MLflow stores its ``user_id`` and its tags
(``slurm.job_id``) as its client sent them, with authentication or without. The link a
run gets figures through is the agent's: ``slurm_job_mlflow_run_info`` (named.py),
whose ``jobid`` and ``user`` come from the job that pushed the run id. A run is written
only when the agent named it for the job its tag names, its ``user_id`` is that job's
user, and the job ended in the window. A run that claims a job the agent named it not
for, or another user, is marked refused and not looked at again. A run that waits (its
job runs, or nobody named it yet) waits at most ``expiry_s`` after it started; then it
is marked expired, so it is not asked about forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slurm_gpu_exporter.model.ids import is_job_id
from slurm_gpu_exporter.report.figures.shapes import JobDetail
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.mlflow.named import Named

TAG_JOB_ID = "slurm.job_id"
TAG_CLUSTER = "slurm.cluster"
TAG_FIGURES = "slurm.figures"
PENDING = "pending"
WRITTEN = "written"
REFUSED = "refused"
EXPIRED = "expired"
TAG_REFUSED_WHY = "slurm.figures_refused"
TAG_EXPIRED_WHY = "slurm.figures_expired"
# The runs to look at: those the training client tagged and nobody filled yet.
PENDING_FILTER = f"tags.`{TAG_FIGURES}` = '{PENDING}'"
DEFAULT_EXPIRY_S = 7 * 86400  # a week: more than most sites' longest job
# A start time this far ahead of the writer's clock is no start time (clock skew aside).
FUTURE_SLACK_S = 86400


@dataclass(frozen=True)
class PendingRun:
    """A run waiting for its job's figures, as MLflow described it (its client's words)."""

    run_id: str
    experiment_id: str
    user_id: str
    job_id: str
    cluster: str
    start_s: float = 0.0  # MLflow's start_time; 0 where the run has none


@dataclass(frozen=True)
class Verdict:
    """What to do with one run: ``write``, ``refuse`` (marked, never again), ``wait``
    (left pending: the job runs, or is not known here yet) or ``expire`` (waited too
    long: marked, never again); ``why`` says it in words."""

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
    try:
        start_s = float(info.get("start_time") or 0) / 1000
    except (TypeError, ValueError):
        start_s = 0.0
    return PendingRun(run_id=run_id, experiment_id=str(info.get("experiment_id", "")),
                      user_id=str(info.get("user_id") or ""), job_id=job_id,
                      cluster=str(tags.get(TAG_CLUSTER) or ""), start_s=start_s)


def for_cluster(run: PendingRun, cluster: str | None) -> bool:
    """Whether the run is this invocation's: any run without ``--cluster``, else only
    the runs that name that cluster (another cluster's writer fills the others)."""
    return cluster is None or run.cluster == cluster


def trusted_jobs(runs: list[PendingRun], named: Named) -> list[str]:
    """The jobs whose figures the runs need: only jobs an agent named a run for, so a
    run's tag alone never makes the writer ask about a job."""
    return sorted({r.job_id for r in runs if r.job_id in named.jobs})


def verdict(run: PendingRun, named: Named, detail: JobDetail | None, window: Window,
            now: float, expiry_s: float = DEFAULT_EXPIRY_S) -> Verdict:
    """Whether ``run`` gets the figures of ``detail``, its tag's job (None: Prometheus
    does not know the job), by the agents' word in ``named``."""
    said = _linked(run, named, detail, window)
    if said.action != "wait" or (detail is not None and detail.running
                                 and any(n.jobid == run.job_id for n in named.of(run.run_id))):
        return said  # a job the agent named this run for waits as long as it runs
    age = now - run.start_s
    if run.start_s <= 0 or age < -FUTURE_SLACK_S or age > expiry_s:
        days = expiry_s / 86400
        return Verdict("expire", f"{said.why} and the run started more than {days:g} days "
                                 "ago (or has no plausible start time)")
    return said


def _linked(run: PendingRun, named: Named, detail: JobDetail | None, window: Window
            ) -> Verdict:
    entries = named.of(run.run_id)
    ended = detail is not None and not detail.running and detail.end is not None
    if not entries:
        if run.job_id in named.jobs and ended:
            return Verdict("refuse", f"job {run.job_id} ended and its agent never named "
                                     "this run (slurm_job_mlflow_run_info)")
        return Verdict("wait", f"no agent named this run for job {run.job_id} (yet)")
    mine = next((n for n in entries if n.jobid == run.job_id), None)
    if mine is None:
        return Verdict("refuse", f"the run says job {run.job_id}, but the agent named it "
                                 f"for job {entries[0].jobid}")
    if not run.user_id or run.user_id != mine.user:
        return Verdict("refuse", f"the run's user {run.user_id or '(none)'} is not job "
                                 f"{run.job_id}'s user {mine.user}")
    if mine.experiment_id and mine.experiment_id != run.experiment_id:
        return Verdict("refuse", f"the run is in experiment {run.experiment_id}, the agent "
                                 f"named it in experiment {mine.experiment_id}")
    return _job_state(run, mine.user, detail, window)


def _job_state(run: PendingRun, user: str, detail: JobDetail | None, window: Window
               ) -> Verdict:
    if detail is None:
        return Verdict("wait", f"job {run.job_id} has no metrics in Prometheus")
    if detail.usage.user != user:
        return Verdict("refuse", f"job {run.job_id}'s user in its metrics is "
                                 f"{detail.usage.user or '(unknown)'}, not {user}")
    if detail.running:
        return Verdict("wait", f"job {run.job_id} is still running")
    end = detail.end
    if end is None or not window.start <= end <= window.end:
        return Verdict("wait", f"job {run.job_id} did not end in the window")
    return Verdict("write", f"job {run.job_id} ended")
