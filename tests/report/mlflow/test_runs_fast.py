"""The MLflow writer's pure parts at their edges: how a run and the agents' word are
read (runs.pending_run, named.named_runs), when a waiting run expires, when a job's end
falls in the window, and every figure and tag a run gets (figures.py), each against
values worked out by hand. Every call is inside a test: mutmut only mutates what a
test calls, never what a module computed on import."""

from __future__ import annotations

import pytest

from slurm_gpu_exporter.report.figures.gpu_events import Throttle
from slurm_gpu_exporter.report.figures.shapes import (
    Accounting,
    GpuDetail,
    JobDetail,
    JobUsage,
    NodeDetail,
)
from slurm_gpu_exporter.report.figures.table import FIGURES, Figure
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.mlflow import figures
from slurm_gpu_exporter.report.mlflow.figures import run_metrics, run_tags
from slurm_gpu_exporter.report.mlflow.named import Named, NamedRun, named_runs, run_info_query
from slurm_gpu_exporter.report.mlflow.runs import (
    PendingRun,
    pending_run,
    trusted_jobs,
    verdict,
)
from slurm_gpu_exporter.report.prometheus.client import Sample
from slurm_gpu_exporter.report.prometheus.queries import Filters

RUN_ID = "a" * 32
WINDOW = Window(10_000.0, 20_000.0)
DAY = 86400.0


def _named() -> Named:
    return named_runs([Sample({"jobid": "4242", "user": "alice", "run_id": RUN_ID,
                               "experiment_id": "1"}, 1)])


def _run(user: str = "alice", start_s: float = 9_000.0) -> PendingRun:
    return PendingRun(RUN_ID, "1", user, "4242", "", start_s=start_s)


def _job(user: str = "alice", end: float | None = 15_000.0) -> JobDetail:
    usage = JobUsage(jobid="4242", user=user, gpus=1, allocated_s=3600.0, busy_s=1800.0,
                     start=8_000.0, end=end)
    return JobDetail(usage, [NodeDetail("n1")], None, now=20_000.0)


# -- the agents' word ----------------------------------------------------------------

def test_each_run_info_sample_is_read_label_by_label() -> None:
    named = named_runs([
        Sample({"jobid": "4242", "user": "alice", "run_id": RUN_ID, "experiment_id": "1"}, 1),
        Sample({"jobid": "4243", "user": "alice", "run_id": RUN_ID}, 1),
        Sample({"jobid": "5151", "user": "bob", "run_id": "b" * 32, "experiment_id": "2"}, 1),
        Sample({"user": "carol", "run_id": "c" * 32}, 1),  # no job: no word
        Sample({"jobid": "6161", "run_id": "d" * 32}, 1),  # no user: no word
    ])
    assert named.by_run == {
        RUN_ID: [NamedRun(RUN_ID, "1", "4242", "alice"), NamedRun(RUN_ID, "", "4243", "alice")],
        "b" * 32: [NamedRun("b" * 32, "2", "5151", "bob")]}
    assert named.jobs == frozenset({"4242", "4243", "5151"})
    assert named.of("b" * 32) == [NamedRun("b" * 32, "2", "5151", "bob")]
    assert named.of("never named") == []


def test_the_run_info_query_groups_the_last_sample_of_each_run() -> None:
    assert run_info_query("2h", Filters(user="alice", cluster="west")) == (
        "group by (jobid, user, run_id, experiment_id) "
        '(last_over_time(slurm_job_mlflow_run_info{cluster="west",user="alice"}[2h]))')


def test_only_jobs_an_agent_named_a_run_for_are_asked_about() -> None:
    runs = [_run(), PendingRun("x" * 32, "1", "bob", "777", ""),
            PendingRun("y" * 32, "1", "alice", "4242", "")]
    assert trusted_jobs(runs, _named()) == ["4242"]
    two = named_runs([Sample({"jobid": j, "user": "u", "run_id": j * 8}, 1)
                      for j in ("9", "10")])
    assert trusted_jobs([PendingRun("r", "", "u", j, "") for j in ("9", "10", "11")],
                        two) == ["10", "9"]


# -- a run as MLflow describes it ------------------------------------------------------

def _raw(info: dict[str, object], tags: dict[str, str] | None = None) -> dict[str, object]:
    tags = {"slurm.job_id": "77", "slurm.figures": "pending"} if tags is None else tags
    return {"info": info, "data": {"tags": [{"key": k, "value": v} for k, v in tags.items()]}}


def test_a_pending_run_is_read_with_its_start_in_seconds() -> None:
    raw = _raw({"run_id": "b" * 32, "experiment_id": "3", "user_id": "alice",
                "start_time": 1_700_000_000_500},
               {"slurm.job_id": "77", "slurm.figures": "pending", "slurm.cluster": "west"})
    assert pending_run(raw) == PendingRun("b" * 32, "3", "alice", "77", "west",
                                          start_s=1_700_000_000.5)


def test_a_run_known_only_by_its_older_uuid_field_is_read() -> None:
    run = pending_run(_raw({"run_uuid": "c" * 32}))
    assert run == PendingRun("c" * 32, "", "", "77", "", start_s=0.0)


@pytest.mark.parametrize("start_time", ["soon", None, [1]])
def test_a_start_time_that_is_no_number_is_none(start_time: object) -> None:
    run = pending_run(_raw({"run_id": "b" * 32, "start_time": start_time}))
    assert run is not None and run.start_s == 0.0


@pytest.mark.parametrize("raw", [
    _raw({}),  # no run id
    _raw({"run_id": "", "run_uuid": ""}),
    {"info": {"run_id": "b" * 32}, "data": {}},  # no tags at all
    {"info": {"run_id": "b" * 32}},
    _raw({"run_id": "b" * 32}, {"slurm.figures": "pending"}),  # no job
])
def test_a_run_without_an_id_or_tags_is_not_pending(raw: dict[str, object]) -> None:
    assert pending_run(raw) is None


# -- when a run waits, expires or is written -------------------------------------------

@pytest.mark.parametrize(("start_s", "now", "action"), [
    (0.0, 100.0, "expire"),  # no start time: it expires as soon as it would wait
    (1.0, 50.0, "wait"),  # one second after the epoch is a start time
    (9_000.0, 9_000.0 + 2 * DAY, "wait"),  # exactly the bound: still waits
    (9_000.0, 9_000.0 + 2 * DAY + 1, "expire"),
    (9_000.0 + DAY, 9_000.0, "wait"),  # exactly a day ahead of our clock: clock skew
    (9_000.0 + DAY + 1, 9_000.0, "expire"),
])
def test_a_waiting_run_expires_past_its_bound_and_not_on_it(
        start_s: float, now: float, action: str) -> None:
    said = verdict(_run(start_s=start_s), Named({}, frozenset()), None, WINDOW, now,
                   expiry_s=2 * DAY)
    assert said.action == action
    if action == "expire":
        assert said.why == ("no agent named this run for job 4242 (yet) and the run started "
                            "more than 2 days ago (or has no plausible start time)")


def test_a_named_run_of_a_running_job_waits_past_the_bound() -> None:
    said = verdict(_run(start_s=1.0), _named(), _job(end=None), WINDOW, 1e9, expiry_s=DAY)
    assert (said.action, said.why) == ("wait", "job 4242 is still running")


def test_an_unnamed_run_of_a_running_job_still_expires() -> None:
    said = verdict(_run(start_s=1.0), Named({}, frozenset()), _job(end=None), WINDOW, 1e9,
                   expiry_s=DAY)
    assert said.action == "expire"


@pytest.mark.parametrize(("end", "action", "why"), [
    (WINDOW.start, "write", "job 4242 ended"),
    (WINDOW.end, "write", "job 4242 ended"),
    (WINDOW.start - 1, "wait", "job 4242 did not end in the window"),
    (WINDOW.end + 1, "wait", "job 4242 did not end in the window"),
])
def test_a_job_that_ended_on_the_windows_edges_is_written(
        end: float, action: str, why: str) -> None:
    said = verdict(_run(), _named(), _job(end=end), WINDOW, 20_000.0)
    assert (said.action, said.why) == (action, why)


@pytest.mark.parametrize(("metrics_user", "shown"), [("bob", "bob"), ("", "(unknown)")])
def test_a_job_whose_metrics_name_another_user_is_refused(metrics_user: str,
                                                           shown: str) -> None:
    said = verdict(_run(), _named(), _job(user=metrics_user), WINDOW, 20_000.0)
    assert (said.action, said.why) == (
        "refuse", f"job 4242's user in its metrics is {shown}, not alice")


def test_a_run_without_a_user_is_refused_in_words() -> None:
    said = verdict(_run(user=""), _named(), _job(), WINDOW, 20_000.0)
    assert (said.action, said.why) == (
        "refuse", "the run's user (none) is not job 4242's user alice")


def test_a_named_run_of_a_job_prometheus_does_not_know_waits() -> None:
    said = verdict(_run(), _named(), None, WINDOW, 20_000.0)
    assert (said.action, said.why) == ("wait", "job 4242 has no metrics in Prometheus")


# -- the figures and tags a run gets ---------------------------------------------------

def _full_job(accounting: Accounting | None) -> JobDetail:
    usage = JobUsage(jobid="4242", user="alice", account="ml", partition="gpu", gpus=2,
                     allocated_s=7200.0, busy_s=1800.0, idle_gpus=1, gpu_memory_peak=2.0**30,
                     start=8_000.0, end=15_200.0, sm_active_s=720.0, gpm_allocated_s=7200.0,
                     tensor_active_s=360.0, dram_active_s=1440.0, unknown_s=1800.0)
    gpus = [GpuDetail("0", "GPU-0", 3600.0, 1800.0, energy_j=3.6e6,
                      throttled=[Throttle("power", 3600.0)]),
            GpuDetail("1", "GPU-1", 3600.0, 0.0, energy_j=0.0,
                      throttled=[Throttle("power", 7200.0), Throttle("sw_thermal", 720.0),
                                 Throttle("no such-name", 1.0)])]
    node = NodeDetail("n1", cpus=4, cpu_s=7200.0, memory_peak=2.0**31, gpus=gpus,
                      cpu_energy_j=3.6e6)
    return JobDetail(usage, [node], accounting, now=20_000.0, gco2e_per_kwh=400.0)


def test_every_figure_goes_in_under_its_name_in_base_units() -> None:
    metrics = run_metrics(_full_job(Accounting(state="COMPLETED", exit_code="0:0")))
    assert metrics == {
        "slurm.gpus": 2.0, "slurm.gpu_hours": 2.0, "slurm.gpu_busy_ratio": 0.25,
        "slurm.wasted_gpu_hours": 1.5, "slurm.idle_gpus": 1.0,
        "slurm.sm_active_ratio": 0.1, "slurm.tensor_active_ratio": 0.05,
        "slurm.dram_active_ratio": 0.2, "slurm.gpu_memory_peak_bytes": 2.0**30,
        "slurm.gpu_energy_joules": 3.6e6, "slurm.cpu_energy_joules": 3.6e6,
        "slurm.emissions_grams": 800.0,  # 2 kWh at 400 g/kWh
        "slurm.run_time_seconds": 7200.0, "slurm.cpu_efficiency_ratio": 0.25,
        "slurm.memory_peak_bytes": 2.0**31, "slurm.unmeasured_gpu_hours": 0.5,
        # 10,800 throttled GPU-seconds of 7,200 held: a share of at most 1
        "slurm.gpu_throttled_ratio.power": 1.0, "slurm.gpu_throttled_ratio.sw_thermal": 0.1}


@pytest.mark.parametrize(("allocated_s", "expected"), [
    (0.5, {"slurm.gpu_throttled_ratio.power": 0.5}), (0.0, {})])
def test_the_throttled_share_needs_time_held(allocated_s: float,
                                             expected: dict[str, float]) -> None:
    usage = JobUsage(jobid="1", allocated_s=allocated_s)
    gpu = GpuDetail("0", "GPU-0", allocated_s, throttled=[Throttle("power", 0.25)])
    metrics = run_metrics(JobDetail(usage, [NodeDetail("n1", gpus=[gpu])], None, now=1.0))
    assert {k: v for k, v in metrics.items() if "throttled" in k} == expected


def test_the_jobs_own_words_go_in_as_tags() -> None:
    assert run_tags(_full_job(Accounting(state="COMPLETED", exit_code="1:0"))) == {
        "slurm.job": "4242", "slurm.user": "alice", "slurm.account": "ml",
        "slurm.partition": "gpu", "slurm.state": "COMPLETED", "slurm.exit_code": "1:0"}


def test_tags_slurm_accounting_does_not_give_are_left_out() -> None:
    assert run_tags(_full_job(None)) == {"slurm.job": "4242", "slurm.user": "alice",
                                         "slurm.account": "ml", "slurm.partition": "gpu"}
    assert run_tags(_full_job(Accounting())) == run_tags(_full_job(None))


def test_a_table_row_with_an_mlflow_name_that_is_no_gpm_activity_goes_in_as_its_value(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A figure the table may add later (here a GPU temperature with no field of its
    own: its value lives in the job's ``more``) reaches MLflow as the job's value."""
    hot = Figure("temperature", "slurm_job_gpu_temperature_max_celsius", "celsius", "peak",
                 "gpu", job_attr="temperature_max", combine="max",
                 mlflow="gpu_temperature_max_celsius")
    monkeypatch.setattr(figures, "FIGURES", (*FIGURES, hot))
    job = _full_job(None)
    job.usage.more = {"temperature_max": 81.0}
    metrics = run_metrics(job)
    assert metrics["slurm.gpu_temperature_max_celsius"] == 81.0
    assert metrics["slurm.tensor_active_ratio"] == 0.05
