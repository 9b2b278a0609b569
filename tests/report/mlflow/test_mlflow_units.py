"""Which runs get which job's figures (report/mlflow/runs.py) and the figures as MLflow
metrics (report/mlflow/figures.py), without a server."""

from __future__ import annotations

import pytest

from slurm_gpu_exporter.report.figures.gpu_events import Throttle
from slurm_gpu_exporter.report.figures.shapes import GpuDetail, JobDetail, JobUsage, NodeDetail
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.mlflow.figures import run_metrics
from slurm_gpu_exporter.report.mlflow.named import Named, NamedRun, named_runs
from slurm_gpu_exporter.report.mlflow.runs import PendingRun, for_cluster, pending_run, verdict
from slurm_gpu_exporter.report.mlflow.tracking import redact
from slurm_gpu_exporter.report.prometheus.client import Sample

WINDOW = Window(10_000.0, 20_000.0)
NOW = 20_000.0
RUN = PendingRun("a" * 32, "1", "alice", "4242", "west", start_s=9_000.0)
# The agent of job 4242 (alice's) named RUN; job 5151 (mallory's) named another run.
NAMED = named_runs([
    Sample({"jobid": "4242", "user": "alice", "run_id": "a" * 32, "experiment_id": "1"}, 1),
    Sample({"jobid": "5151", "user": "mallory", "run_id": "c" * 32, "experiment_id": "9"}, 1),
])
NOBODY = Named({}, frozenset())


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
    assert run.start_s == 0.0  # no start_time: it expires as soon as it would wait


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


def test_the_ended_jobs_run_named_by_its_agent_is_written():
    assert verdict(RUN, NAMED, _detail(), WINDOW, NOW).action == "write"


def test_a_run_no_agent_named_is_never_written_whatever_it_says():
    """Its user_id and tag match the job: what a client sends proves nothing."""
    said = verdict(RUN, NOBODY, _detail(), WINDOW, NOW)
    assert said.action == "wait"


def test_a_run_claiming_an_ended_job_whose_agent_named_others_is_refused():
    claim = PendingRun("d" * 32, "1", "mallory", "5151", "", start_s=9_000.0)
    said = verdict(claim, NAMED, _detail(user="mallory"), WINDOW, NOW)
    assert (said.action, said.why) == (
        "refuse", "job 5151 ended and its agent never named this run (slurm_job_mlflow_run_info)")


def test_a_run_named_for_one_job_claiming_another_is_refused():
    forged = PendingRun("c" * 32, "9", "alice", "4242", "", start_s=9_000.0)
    said = verdict(forged, NAMED, _detail(), WINDOW, NOW)
    assert (said.action, said.why) == (
        "refuse", "the run says job 4242, but the agent named it for job 5151")


def test_a_named_run_claiming_another_user_is_refused():
    said = verdict(PendingRun("a" * 32, "1", "bob", "4242", "", 9_000.0), NAMED, _detail(),
                   WINDOW, NOW)
    assert (said.action, said.why) == ("refuse", "the run's user bob is not job 4242's user alice")


def test_a_run_without_a_user_is_refused():
    anonymous = PendingRun("a" * 32, "1", "", "4242", "", 9_000.0)
    assert verdict(anonymous, NAMED, _detail(), WINDOW, NOW).action == "refuse"


@pytest.mark.parametrize(("detail", "why"), [
    (None, "job 4242 has no metrics in Prometheus"),
    (_detail(end=None), "job 4242 is still running"),
    (_detail(end=9_000.0), "job 4242 did not end in the window"),
])
def test_runs_of_unknown_running_or_earlier_jobs_wait(detail, why):
    said = verdict(RUN, NAMED, detail, WINDOW, NOW)
    assert (said.action, said.why) == ("wait", why)


@pytest.mark.parametrize(("named", "detail"), [
    (NOBODY, None), (NAMED, None), (NAMED, _detail(end=9_000.0))])
def test_a_waiting_run_expires_after_the_bound_on_a_clock_we_set(named, detail):
    """RUN started at 9,000 s: it waits up to the bound (100 s here), then expires."""
    assert verdict(RUN, named, detail, WINDOW, 9_090.0, expiry_s=100).action == "wait"
    assert verdict(RUN, named, detail, WINDOW, 9_101.0, expiry_s=100).action == "expire"


def test_a_run_of_a_job_still_running_never_expires():
    said = verdict(RUN, NAMED, _detail(end=None), WINDOW, 1e9, expiry_s=100)
    assert said.action == "wait"


def test_a_run_starting_in_the_far_future_expires_at_once():
    later = PendingRun("a" * 32, "1", "alice", "4242", "", start_s=NOW + 10 * 86400)
    assert verdict(later, NOBODY, None, WINDOW, NOW).action == "expire"


def test_the_agents_word_is_read_from_the_run_info_series():
    assert NAMED.of("a" * 32) == [NamedRun("a" * 32, "1", "4242", "alice")]
    assert NAMED.jobs == {"4242", "5151"}
    assert named_runs([Sample({"run_id": "e" * 32, "jobid": "1"}, 1)]).by_run == {}


@pytest.mark.parametrize(("url", "shown"), [
    ("https://u:p%40ss@mlflow.example.org/x", "https://mlflow.example.org/x"),
    ("https://u:p@ss@host:5000", "https://host:5000"),
    ("http://token@host", "http://host"),
    ("ftp://u:pw@host", "ftp://host"),
    ("https://host/a@b", "https://host/a@b"),
])
def test_the_tracking_uri_is_shown_without_its_credentials(url, shown):
    assert redact(url) == shown


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
