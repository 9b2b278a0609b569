"""enforce's idle windows and decisions on fixed query answers (no Prometheus, no Slurm)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from slurm_gpu_exporter.model.slurm_id import SlurmJobId
from slurm_gpu_exporter.report.enforce.decisions import Decision, decide
from slurm_gpu_exporter.report.enforce.idle_window import idle_queries, jobs_from_answers
from slurm_gpu_exporter.report.enforce.policy import parse_policy
from slurm_gpu_exporter.report.prometheus.client import Sample
from slurm_gpu_exporter.report.prometheus.nodes import node_name
from slurm_gpu_exporter.report.prometheus.queries import Filters
from slurm_gpu_exporter.report.slurm.squeue import SlurmJob, parse_squeue_json

NOW = 1_800_000_000.0
POLICY = parse_policy('[idle]\nmax_cancels_per_run = 1\n[exempt]\njob_names = ["keep-*"]\n')
WINDOWS = POLICY.windows_s  # 60m, 90m, 120m
H = 3600.0


@dataclass
class FakeJob:
    """A job's counters: busy seconds gained in each window, per GPU (one node)."""

    jobid: str
    age: float
    busy_in: dict[float, float] = field(default_factory=dict)  # window -> busy gained
    gpus: int = 1
    instance: str = "gpu01:9817"
    user: str = "ann"
    covered: float = 1.0  # share of each window the allocated counter grew


def answers(jobs: list[FakeJob], up: float = 1, nvml: float = 1,
            fresh_age: float = 2) -> dict[str, list[Sample]]:
    got: dict[str, list[Sample]] = {name: [] for name in idle_queries(WINDOWS, Filters())}
    instances = {j.instance for j in jobs}
    for instance in instances:
        got["up"].append(Sample({"instance": instance}, up))
        got["last_sample"].append(Sample({"instance": instance}, NOW - 1))
    for job in jobs:
        got["start"].append(Sample({"jobid": job.jobid}, NOW - job.age))
        for gpu in range(job.gpus):
            labels = {"jobid": job.jobid, "user": job.user, "instance": job.instance,
                      "gpu": str(gpu), "uuid": f"GPU-{gpu}"}
            got["held"].append(Sample(labels, job.age))
            got["fresh"].append(Sample(labels, NOW - fresh_age))
            for window in WINDOWS:
                d = f"{round(window)}s"
                held = min(window, job.age) * job.covered
                got[f"allocated_{d}"].append(Sample(labels, held))
                got[f"busy_{d}"].append(Sample(labels, job.busy_in.get(window, 0.0)))
    for window in WINDOWS:
        got[f"nvml_{round(window)}s"] = [Sample({"instance": i}, nvml) for i in instances]
    return got


def slurm_of(*jobs: FakeJob, name: str = "train", state: str = "RUNNING",
             nodes: tuple[str, ...] | None = None, gpus: int | None = None
             ) -> dict[str, SlurmJob]:
    """Slurm's view of the jobs: by default the nodes and GPU count the metrics show."""
    return {j.jobid: SlurmJob(j.jobid, j.user, "lab", "gpu", "normal", name, state,
                              nodes or (node_name(j.instance),),
                              j.gpus if gpus is None else gpus, ident=SlurmJobId(j.jobid))
            for j in jobs}


def run(jobs: list[FakeJob], sent: dict[str, list[float]] | None = None,
        slurm: dict[str, SlurmJob] | None = None, **kw: float) -> dict[str, Decision]:
    seen = jobs_from_answers(answers(jobs, **kw), WINDOWS, POLICY.busy_fraction, NOW)
    decisions = decide(seen, slurm if slurm is not None else slurm_of(*jobs), sent or {},
                       POLICY, NOW)
    return {d.jobid: d for d in decisions}


def test_query_count_does_not_grow_with_the_jobs() -> None:
    assert len(idle_queries(WINDOWS, Filters())) == 3 * len(WINDOWS) + 5


def test_job_idle_since_start_gets_first_warning_then_second() -> None:
    job = FakeJob("10", age=1.6 * H)
    first = run([job])["10"]
    assert (first.action, first.warning, first.idle_for_s) == ("warn", 1, 1.5 * H)
    second = run([job], sent={"10": [NOW - 600]})["10"]
    assert (second.action, second.warning) == ("warn", 2)
    assert second.cancel_at == NOW + 0.5 * H


def test_job_idle_past_cancel_time_is_cancelled_after_both_warnings() -> None:
    job = FakeJob("11", age=3 * H)
    decision = run([job], sent={"11": [NOW - 2 * H, NOW - H]})["11"]
    assert decision.action == "cancel"
    assert "after 2 warning(s)" in decision.reason


def test_cancel_waits_the_promised_time_after_a_late_last_warning() -> None:
    # First runs of enforce on an already idle job: warned twice just now, not cancelled.
    job = FakeJob("12", age=5 * H)
    assert run([job])["12"].action == "warn"
    decision = run([job], sent={"12": [NOW - 600, NOW - 300]})["12"]
    assert decision.action == "none"
    assert "last warning" in decision.reason


def test_busy_then_idle_job_is_caught_by_the_sliding_window() -> None:
    # Busy for its first 2 hours (lifetime ratio near 50 %), idle for the last 60 minutes.
    job = FakeJob("13", age=4 * H, busy_in={5400: 0.5 * H, 7200: 1.5 * H})
    decision = run([job])["13"]
    assert (decision.action, decision.idle_for_s) == ("warn", 3600)


def test_busy_job_is_untouched_and_its_warnings_forgotten() -> None:
    job = FakeJob("14", age=4 * H, busy_in={3600: 0.5 * H, 5400: H, 7200: H})
    decision = run([job], sent={"14": [NOW - H]})["14"]
    assert decision.action == "none"
    assert decision.forget_warnings


def test_busy_under_the_fraction_counts_as_idle() -> None:
    job = FakeJob("15", age=1.1 * H, busy_in={3600: 0.005 * H})
    assert run([job])["15"].action == "warn"


def test_one_busy_gpu_of_several_keeps_the_job_from_idle() -> None:
    got = answers([FakeJob("16", age=2 * H, gpus=2)])
    for window in WINDOWS:
        got[f"busy_{round(window)}s"][1] = Sample(got[f"busy_{round(window)}s"][1].labels,
                                                  0.5 * window)
    seen = jobs_from_answers(got, WINDOWS, POLICY.busy_fraction, NOW)
    assert decide(seen, slurm_of(FakeJob("16", 0)), {}, POLICY, NOW)[0].action == "none"


def test_young_job_is_skipped() -> None:
    decision = run([FakeJob("17", age=600)])["17"]
    assert decision.action == "skip" and "min_job_age" in decision.reason
    assert not decision.doubtful


def test_exempt_job_is_skipped() -> None:
    job = FakeJob("18", age=3 * H)
    decision = run([job], sent={"18": [NOW - 2 * H, NOW - H]},
                   slurm=slurm_of(job, name="keep-me"))["18"]
    assert decision.action == "skip" and "exempt" in decision.reason


def test_target_down_nvml_down_and_stale_series_are_doubtful_skips() -> None:
    job = FakeJob("19", age=3 * H)
    sent = {"19": [NOW - 2 * H, NOW - H]}
    for kw, words in (({"up": 0}, "is down"), ({"nvml": 0}, "NVML was down"),
                      ({"fresh_age": 600}, "stale")):
        decision = run([job], sent=sent, **kw)["19"]
        assert (decision.action, decision.doubtful) == ("skip", True), kw
        assert words in decision.reason


def test_gaps_in_the_counters_are_doubtful() -> None:
    job = FakeJob("20", age=3 * H, covered=0.5)
    decision = run([job], sent={"20": [NOW - 2 * H, NOW - H]})["20"]
    assert decision.doubtful and "do not cover" in decision.reason


def test_job_slurm_does_not_run_is_skipped_and_a_user_mismatch_is_doubtful() -> None:
    job = FakeJob("21", age=3 * H)
    sent = {"21": [NOW - 2 * H, NOW - H]}
    ended = run([job], sent=sent, slurm={}, fresh_age=600)["21"]  # gone, series lingering
    assert (ended.action, ended.doubtful) == ("skip", False)
    finished = run([job], sent=sent, slurm=slurm_of(job, state="COMPLETED"))["21"]
    assert (finished.action, finished.doubtful) == ("skip", False)
    other = {"21": SlurmJob("21", "mallory", "lab", "gpu", "normal", "x", "RUNNING",
                            ("gpu01",), 1, ident=SlurmJobId("21"))}
    mismatch = run([job], slurm=other)["21"]
    assert mismatch.doubtful and "mallory" in mismatch.reason


def test_job_slurm_does_not_list_as_running_while_its_series_are_fresh_is_doubtful() -> None:
    job = FakeJob("22", age=3 * H)
    sent = {"22": [NOW - 2 * H, NOW - H]}
    for slurm, words in (({}, "does not list the job"),
                         (slurm_of(job, state="PENDING"), "PENDING, not RUNNING"),
                         (slurm_of(job, state="SUSPENDED"), "SUSPENDED, not RUNNING")):
        decision = run([job], sent=sent, slurm=slurm)["22"]
        assert (decision.action, decision.doubtful) == ("skip", True), words
        assert words in decision.reason


def test_job_with_a_node_that_has_no_series_is_doubtful_never_cancelled() -> None:
    """Issue 33: a job on gpu01 and gpu02 whose gpu02 has no series at all (the agent not
    deployed there yet) was judged on gpu01 alone, idle, and cancelled."""
    job = FakeJob("23", age=3 * H)
    sent = {"23": [NOW - 2 * H, NOW - H]}
    assert run([job], sent=sent)["23"].action == "cancel"  # on one node: due
    decision = run([job], sent=sent, slurm=slurm_of(job, nodes=("gpu01", "gpu02"),
                                                    gpus=2))["23"]
    assert (decision.action, decision.doubtful) == ("skip", True)
    assert "Slurm runs it on gpu02 too" in decision.reason


def test_fewer_gpus_with_fresh_series_than_slurm_allocated_is_doubtful() -> None:
    job = FakeJob("24", age=3 * H, gpus=2)
    sent = {"24": [NOW - 2 * H, NOW - H]}
    decision = run([job], sent=sent, slurm=slurm_of(job, gpus=4))["24"]
    assert (decision.action, decision.doubtful) == ("skip", True)
    assert "Slurm allocated 4 GPU(s), fresh series show 2" in decision.reason
    unknown = {"24": SlurmJob("24", "ann", "lab", "gpu", "normal", "x", "RUNNING",
                              ident=SlurmJobId("24"))}
    assert "does not say which nodes" in run([job], sent=sent, slurm=unknown)["24"].reason


def test_the_node_label_names_the_slurm_node() -> None:
    job = FakeJob("25", age=3 * H, instance="10.0.0.7:9817")
    got = answers([job])
    for sample in got["held"]:
        sample.labels["node"] = "gpu07"
    seen = jobs_from_answers(got, WINDOWS, POLICY.busy_fraction, NOW, node_label="node")
    assert seen[0].nodes == ["gpu07"] and seen[0].fresh_nodes == {"gpu07"}
    by_instance = jobs_from_answers(got, WINDOWS, POLICY.busy_fraction, NOW)
    assert by_instance[0].nodes == ["10.0.0.7"]


def test_cap_defers_the_cancels_of_the_least_idle_jobs() -> None:
    jobs = [FakeJob("30", age=3 * H), FakeJob("31", age=3 * H)]
    sent = {"30": [NOW - 2 * H, NOW - H], "31": [NOW - 2 * H, NOW - H]}
    decisions = run(jobs, sent=sent)
    actions = sorted(d.action for d in decisions.values())
    assert actions == ["cancel", "skip"]
    assert "max_cancels_per_run (1)" in next(d.reason for d in decisions.values()
                                             if d.action == "skip")


def test_squeue_json_keeps_running_jobs_and_names_verbatim() -> None:
    text = ('{"jobs": [{"job_id": 5, "user_name": "ann", "account": "lab", '
            '"partition": "gpu", "qos": "normal", "name": "a|b\\nc", "job_state": "RUNNING"},'
            '{"job_id": 6, "user_name": "bo", "job_state": ["PENDING"]}]}')
    jobs = parse_squeue_json(text)
    assert list(jobs) == ["5", "6"] and jobs["6"].state == "PENDING"
    assert jobs["5"].running and not jobs["6"].running
    assert jobs["5"].name == "a|b\nc" and jobs["5"].user == "ann"


def test_squeue_json_gives_each_jobs_nodes_and_gpu_count() -> None:
    """22.05's shape, 23.11's, and what cannot be read (a hostlist, no TRES)."""
    old = {"job_id": 1, "job_state": "RUNNING", "nodes": "gpu[1-2]", "start_time": 1796159018,
           "tres_alloc_str": "cpu=4,mem=1G,node=2,billing=4,gres/gpu=3",
           "job_resources": {"allocated_nodes": [{"nodename": "gpu2"}, {"nodename": "gpu1"}]}}
    new = {"job_id": 2, "job_state": ["RUNNING"], "nodes": "gpu3",
           "start_time": {"set": True, "infinite": False, "number": 1796159100},
           "tres_alloc_str": "cpu=1,gres/gpu:a100=1,gres/gpu=1",
           "job_resources": {"nodes": {"list": "gpu3", "allocation": [{"name": "gpu3"}]}}}
    vague = {"job_id": 3, "job_state": "RUNNING", "nodes": "gpu[4-5]"}
    cpu_only = {"job_id": 4, "job_state": "RUNNING", "nodes": "cpu1",
                "tres_alloc_str": "cpu=1,mem=1G,node=1"}
    jobs = parse_squeue_json(json.dumps({"jobs": [old, new, vague, cpu_only]}))
    assert (jobs["1"].nodes, jobs["1"].gpus) == (("gpu1", "gpu2"), 3)
    assert (jobs["2"].nodes, jobs["2"].gpus) == (("gpu3",), 1)
    assert (jobs["3"].nodes, jobs["3"].gpus) == (None, None)
    assert (jobs["4"].nodes, jobs["4"].gpus) == (("cpu1",), 0)
    assert (jobs["1"].start, jobs["2"].start, jobs["3"].start) == (1796159018, 1796159100, None)
