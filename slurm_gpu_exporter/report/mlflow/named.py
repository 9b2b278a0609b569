"""Which runs the agents named, and for which job: ``slurm_job_mlflow_run_info{jobid,
user, run_id, experiment_id}``. Pure: the query and the reading of its answer, no I/O.

The training client pushes the ids of the run it has active through the training
relay; the agent labels them with ``jobid`` and ``user`` of the job whose cgroup the
sender is in, never with what the sender says. So this series, not what a run says of
itself (its ``user_id`` and tags are whatever its client sent), is what links a run to
a job. One instant query covers every run of every job, however many there are.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_gpu_exporter.report.prometheus.client import Sample
from slurm_gpu_exporter.report.prometheus.queries import Filters, selector

RUN_INFO = "slurm_job_mlflow_run_info"


@dataclass(frozen=True)
class NamedRun:
    """One run as an agent named it: the job it was pushed from and that job's user."""

    run_id: str
    experiment_id: str
    jobid: str
    user: str


@dataclass(frozen=True)
class Named:
    """The agents' word on every run: by run id, and the jobs that named any run."""

    by_run: dict[str, list[NamedRun]]
    jobs: frozenset[str]

    def of(self, run_id: str) -> list[NamedRun]:
        return self.by_run.get(run_id, [])


def run_info_query(lookback: str, filters: Filters) -> str:
    """Every (job, user, run, experiment) an agent showed within ``lookback``."""
    sel = selector(RUN_INFO, filters.matchers())
    return (f"group by (jobid, user, run_id, experiment_id) "
            f"(last_over_time({sel}[{lookback}]))")


def named_runs(samples: list[Sample]) -> Named:
    """The answer of ``run_info_query``; a sample without a job, user or run is no word."""
    by_run: dict[str, list[NamedRun]] = {}
    for sample in samples:
        labels = sample.labels
        named = NamedRun(run_id=labels.get("run_id", ""),
                         experiment_id=labels.get("experiment_id", ""),
                         jobid=labels.get("jobid", ""), user=labels.get("user", ""))
        if named.run_id and named.jobid and named.user:
            by_run.setdefault(named.run_id, []).append(named)
    jobs = frozenset(n.jobid for runs in by_run.values() for n in runs)
    return Named(by_run, jobs)
