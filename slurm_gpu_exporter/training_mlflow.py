"""The training client's MLflow side: the active MLflow run learns its Slurm job, and the
agent learns the run.

Only when the training script uses MLflow: mlflow is never imported here, only found in
``sys.modules`` where the script imported it (mlflow is no dependency of the package).
When a run is active, it gets the tags ``slurm.job_id`` (the job's own id, what the
agent labels series with), ``slurm.cluster``, ``slurm.array_task`` (``A_T`` for an array
task), ``slurm.dashboard`` (only where the site set ``SLURM_GPU_DASHBOARD_URL``) and
``slurm.figures = pending`` (``slurm-gpu-report mlflow`` writes the job's figures into
the run after the job ends and sets it to ``written``), once per run; and the pushes
carry ``slurm_job_training_mlflow_run_info{run_id, experiment_id} 1``, which the agent
shows as ``slurm_job_mlflow_run_info`` with the job's ``jobid`` and ``user``.

The run is looked for on the thread that calls step() or relay() (MLflow keeps the
active run per thread), at most every ``CHECK_INTERVAL`` seconds; the tags are set from
the sender's thread, so the tracking server's latency never reaches the training loop.
Standard library and prometheus-client only.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

TAG_JOB_ID = "slurm.job_id"
TAG_CLUSTER = "slurm.cluster"
TAG_ARRAY_TASK = "slurm.array_task"
TAG_DASHBOARD = "slurm.dashboard"
TAG_FIGURES = "slurm.figures"  # pending until slurm-gpu-report mlflow wrote them
FIGURES_PENDING = "pending"
DASHBOARD_ENV = "SLURM_GPU_DASHBOARD_URL"
RUN_INFO = "slurm_job_training_mlflow_run_info"
CHECK_INTERVAL = 5.0
MAX_RUNS = 8  # runs of one process shown in the info series (a sweep starts many)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActiveRun:
    """An MLflow run, as MLflow names it."""

    run_id: str
    experiment_id: str


def active_run() -> ActiveRun | None:
    """The MLflow run active on this thread; None where mlflow is not imported."""
    mlflow = sys.modules.get("mlflow")
    active = getattr(mlflow, "active_run", None)
    if active is None:
        return None
    run = active()
    if run is None:
        return None
    return ActiveRun(str(run.info.run_id), str(run.info.experiment_id))


def job_tags(environ: Mapping[str, str]) -> dict[str, str]:
    """The tags that tie a run to the Slurm job of ``environ``; empty outside a job."""
    jobid = environ.get("SLURM_JOB_ID", "")
    if not jobid.isdigit():
        return {}
    tags = {TAG_JOB_ID: jobid, TAG_FIGURES: FIGURES_PENDING}
    if environ.get("SLURM_CLUSTER_NAME"):
        tags[TAG_CLUSTER] = environ["SLURM_CLUSTER_NAME"]
    array_job, task = environ.get("SLURM_ARRAY_JOB_ID", ""), environ.get("SLURM_ARRAY_TASK_ID", "")
    if array_job.isdigit() and task.isdigit():
        tags[TAG_ARRAY_TASK] = f"{array_job}_{task}"  # as users and sacct name the task
    link = dashboard_link(environ.get(DASHBOARD_ENV, ""), jobid)
    if link:
        tags[TAG_DASHBOARD] = link
    return tags


def dashboard_link(base: str, jobid: str) -> str:
    """The site's dashboard URL for the job: ``{jobid}`` in ``base`` replaced, else
    Grafana's ``var-jobid`` added; "" where the site configured none (never guessed)."""
    if not base.startswith(("http://", "https://")):
        return ""
    if "{jobid}" in base:
        return base.replace("{jobid}", jobid)
    return f"{base}{'&' if '?' in base else '?'}var-jobid={jobid}"


def tag_run(run: ActiveRun, tags: Mapping[str, str]) -> None:
    """Set ``tags`` on ``run`` through the script's own MLflow client (may block)."""
    mlflow = sys.modules["mlflow"]
    run_tags = [mlflow.entities.RunTag(key, value) for key, value in tags.items()]
    mlflow.MlflowClient().log_batch(run.run_id, tags=run_tags)


class RunWatch(Collector):
    """Which MLflow runs this process had active: tagged once each, shown to the agent."""

    def __init__(self, environ: Mapping[str, str] = os.environ,
                 tagger: Callable[[ActiveRun, Mapping[str, str]], None] = tag_run,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._tags = job_tags(environ)
        self._tagger = tagger
        self._clock = clock
        self._lock = threading.Lock()
        self._next_check = 0.0
        self._runs: list[ActiveRun] = []
        self._untagged: list[ActiveRun] = []

    @property
    def seen(self) -> bool:
        """Whether any run was found so far."""
        return bool(self._runs)

    def observe(self) -> bool:
        """Look for an active run (on the training thread, at most every
        ``CHECK_INTERVAL`` s); True when a new one was found. Never raises."""
        now = self._clock()
        if now < self._next_check:
            return False
        self._next_check = now + CHECK_INTERVAL
        try:
            run = active_run()
        except Exception:
            return False
        with self._lock:
            if run is None or run in self._runs:
                return False
            self._runs = [*self._runs, run][-MAX_RUNS:]
            if self._tags:
                self._untagged.append(run)
        return True

    def tag_new_runs(self) -> None:
        """Tag the runs found since the last call (the sender's thread); a run whose
        tagging failed is not tried again: its info series still names it."""
        with self._lock:
            todo, self._untagged = self._untagged, []
        for run in todo:
            try:
                self._tagger(run, self._tags)
            except Exception as exc:
                log.warning("MLflow run %s not tagged with its Slurm job: %s", run.run_id, exc)

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            runs = list(self._runs)
        if not runs:
            return
        family = GaugeMetricFamily(RUN_INFO, "MLflow runs the job's script had active; "
                                   "value is always 1.", labels=["run_id", "experiment_id"])
        for run in runs:
            family.add_metric([run.run_id, run.experiment_id], 1)
        yield family
