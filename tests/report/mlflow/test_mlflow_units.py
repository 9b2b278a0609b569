"""Which runs get which job's figures (report/mlflow/runs.py) and the figures as MLflow
metrics (report/mlflow/figures.py), without a server."""

from __future__ import annotations

import pytest

from slurm_gpu_exporter.report.figures.gpu_events import Throttle
from slurm_gpu_exporter.report.figures.shapes import GpuDetail, JobDetail, JobUsage, NodeDetail
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.mlflow.figures import run_metrics
from slurm_gpu_exporter.report.mlflow.runs import PendingRun, for_cluster, pending_run, verdict

WINDOW = Window(10_000.0, 20_000.0)
RUN = PendingRun("a" * 32, "1", "alice", "4242", "west")


def _detail(user: str = "alice", end: float | None = 15_000.0) -> JobDetail:
    usage = JobUsage(jobid="4242", user=user, gpus=2, allocated_s=7200.0, busy_s=3600.0,
                     start=8_000.0, end=end, gpu_memory_peak=2.0**30)
    gpus = [GpuDetail("0", "GPU-0", 3600.0, 3000.0, energy_j=1000.0),
            GpuDetail("1", "GPU-1", 3600.0, 600.0, energy_j=500.0)]
    return JobDetail(usage, [NodeDetail("n1", gpus=gpus)], None, now=20_000.0)


def _raw(tags: dict[str, str], user: str = "alice") -> dict:
    return {"info": {"run_id": "b" * 32, "experiment_id": "3", "user_id": user},
            "data": {"tags": [{"key": k, "value": v} for k, v in tags.items()]}}


def test_a_pending_run_is_read_with_its_job_and_cluster():
    run = pending_run(_raw({"slurm.job_id": "77", "slurm.figures": "pending",
                            "slurm.cluster": "west"}))
    assert run == PendingRun("b" * 32, "3", "alice", "77", "west")


@pytest.mark.parametrize("tags", [
    {"slurm.job_id": "77"},  # not pending
    {"slurm.job_id": "77", "slurm.figures": "written"},
    {"slurm.job_id": "77_3", "slurm.figures": "pending"},  # not a job's own id
    {"slurm.job_id": '77"} or vector(1)', "slurm.figures": "pending"},
    {"slurm.job_id": "0", "slurm.figures": "pending"},
    {"slurm.figures": "pending"},
])
def test_a_run_of_another_shape_is_not_pending(tags):
    assert pending_run(_raw(tags)) is None


def test_the_ended_jobs_run_of_its_own_user_is_written():
    assert verdict(RUN, _detail(), WINDOW).action == "write"


def test_a_run_claiming_another_users_job_is_refused():
    said = verdict(RUN, _detail(user="bob"), WINDOW)
    assert said.action == "refuse"
    assert said.why == "the run's user alice is not job 4242's user bob"


def test_a_run_without_a_user_is_refused():
    anonymous = PendingRun("a" * 32, "1", "", "4242", "")
    assert verdict(anonymous, _detail(user=""), WINDOW).action == "refuse"


@pytest.mark.parametrize(("detail", "why"), [
    (None, "job 4242 has no metrics in Prometheus"),
    (_detail(end=None), "job 4242 is still running"),
    (_detail(end=9_000.0), "job 4242 did not end in the window"),
])
def test_runs_of_unknown_running_or_earlier_jobs_wait(detail, why):
    said = verdict(RUN, detail, WINDOW)
    assert (said.action, said.why) == ("wait", why)


def test_with_cluster_only_the_runs_naming_it_are_taken():
    assert for_cluster(RUN, None) and for_cluster(RUN, "west")
    assert not for_cluster(RUN, "east")


def test_metrics_are_the_job_figures_in_base_units_and_unknown_ones_left_out():
    detail = _detail()
    # The report's own per-GPU throttle figures, summed over the GPUs: 720 of 7200 s.
    detail.nodes[0].gpus[0].throttled = [Throttle("power", 500.0), Throttle("bad reason!", 1.0)]
    detail.nodes[0].gpus[1].throttled = [Throttle("power", 220.0)]
    metrics = run_metrics(detail)
    assert metrics["slurm.gpu_hours"] == 2.0
    assert metrics["slurm.gpu_busy_ratio"] == 0.5
    assert metrics["slurm.gpu_memory_peak_bytes"] == 2.0**30
    assert metrics["slurm.gpu_energy_joules"] == 1500.0
    assert metrics["slurm.gpu_throttled_ratio.power"] == 0.1
    assert not any("bad" in key for key in metrics)
    for absent in ("slurm.sm_active_ratio", "slurm.emissions_grams"):
        assert absent not in metrics  # no GPM, no factor: left out, never 0
