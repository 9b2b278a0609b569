"""remediate's requeue of the jobs on a faulty GPU (--requeue-opt): off by default; only
jobs that Prometheus shows fresh on that GPU AND Slurm lists running on that node; each
by its one target, once per firing and per job; a job's own comment opts it out (all)
or in (opt-in); a --no-requeue job is signalled, never requeued; the grace is a task
and what is due survives a restart."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from slurm_gpu_exporter.model.slurm_id import SlurmJobId
from slurm_gpu_exporter.report.cli.main import main
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.prometheus.client import Sample
from slurm_gpu_exporter.report.remediate.confirm import Episode, Fault, Firing
from slurm_gpu_exporter.report.remediate.holders import holders, holders_query
from slurm_gpu_exporter.report.remediate.memory import ActedOn
from slurm_gpu_exporter.report.remediate.observe import RemediateMetrics
from slurm_gpu_exporter.report.remediate.pending import (
    PendingRequeue,
    RequeueBook,
    requeue_state_path,
)
from slurm_gpu_exporter.report.remediate.remediator import Remediator
from slurm_gpu_exporter.report.remediate.requeue_policy import RequeuePolicy, choose, opted
from slurm_gpu_exporter.report.remediate.requeuer import Requeuer, requeue_verdict
from slurm_gpu_exporter.report.remediate.webhook import make_app
from slurm_gpu_exporter.report.slurm import actions
from slurm_gpu_exporter.report.slurm.actions import SlurmNode
from slurm_gpu_exporter.report.slurm.squeue import SlurmJob, parse_squeue_json

NOW = 1796119200.0
START = NOW - 3600
LABELS = {"alertname": "SlurmGpuXidResetRequired", "instance": "gpu07:9817",
          "job": "slurm-gpu-exporter", "gpu": "1", "uuid": "GPU-one", "xid": "79"}
EPISODE = Episode.of(LABELS, NOW - 60)
ALL = RequeuePolicy("all", grace_s=0.05)


def series(jobid: str, gpu: str, uuid: str, age: float = 5.0) -> Sample:
    return Sample({"instance": "gpu07:9817", "job": "slurm-gpu-exporter", "jobid": jobid,
                   "user": "alice", "gpu": gpu, "uuid": uuid}, NOW - age)


def job(jobid: str, node: str = "gpu07", state: str = "RUNNING", comment: str = "",
        requeue: bool | None = True, ident: SlurmJobId | None = None,
        start: float = START, batch: bool | None = True) -> SlurmJob:
    return SlurmJob(jobid, "alice", "a", "p", "q", "train", state, (node,), 1, start,
                    ident or SlurmJobId(jobid), comment, requeue, batch)


# --- which jobs hold the GPU (Prometheus) --------------------------------------------


def test_only_fresh_series_on_the_faulty_gpu_name_a_job() -> None:
    samples = [series("10", "1", "GPU-one"), series("11", "0", "GPU-zero"),
               series("12", "1", "GPU-one", age=600), series("13", "1", "GPU-other"),
               series("14", "1.2", "MIG-x"), series("15", "11", "GPU-eleven"),
               series("$(reboot)", "1", "GPU-one")]
    assert holders(samples, EPISODE, NOW) == {"10", "14"}


def test_an_alert_naming_no_gpu_names_no_job() -> None:
    bare = Episode.of({k: v for k, v in LABELS.items() if k not in ("gpu", "uuid")}, NOW)
    assert holders([series("10", "1", "GPU-one")], bare, NOW) == set()


def test_the_holders_query_is_bound_to_the_alerts_target() -> None:
    query = holders_query(EPISODE, None)
    assert query == ('timestamp(slurm_job_gpu_allocated_seconds_total{instance="gpu07:9817"'
                     ',job="slurm-gpu-exporter"})')
    hostile = Episode.of(LABELS | {"instance": 'x"}or vector(1)#'}, NOW)
    assert '\\"}or vector(1)#' in (holders_query(hostile, None) or "")
    assert holders_query(Episode.of({"gpu": "1"}, NOW), None) is None


# --- the decision (Slurm, policy, once per job) ---------------------------------------


def test_off_by_default_picks_no_job() -> None:
    assert not RequeuePolicy().enabled
    assert choose(RequeuePolicy(), "gpu07", {"10"}, {"10": job("10")}, set()) == []


def test_a_job_slurm_does_not_list_running_on_that_node_is_skipped() -> None:
    listed = {"10": job("10", node="gpu08"), "11": job("11", state="PENDING"),
              "12": job("12")}
    choices = choose(ALL, "gpu07", {"10", "11", "12", "13"}, listed, set())
    assert [(c.jobid, c.act, c.reason) for c in choices] == [
        ("10", False, "not_on_node"), ("11", False, "not_on_node"), ("12", True, "picked"),
        ("13", False, "not_listed")]


def test_an_array_task_is_named_as_a_t_and_a_het_job_as_a_whole_once() -> None:
    task = job("31", ident=SlurmJobId("31", "30", "1"))
    lead = job("40", ident=SlurmJobId("40", het_job_id="40", het_job_offset="0"))
    comp = job("41", ident=SlurmJobId("41", het_job_id="40", het_job_offset="1"))
    choices = choose(ALL, "gpu07", {"31", "40", "41"},
                     {"31": task, "40": lead, "41": comp}, set())
    assert [c.target for c in choices] == ["30_1", "40"]
    assert [j.jobid for j in choices[1].jobs] == ["40", "41"]


def test_a_job_acted_on_before_is_not_signalled_again_but_its_next_run_is() -> None:
    done = {"10@" + f"{START:.0f}"}
    (choice,) = choose(ALL, "gpu07", {"10"}, {"10": job("10")}, done)
    assert (choice.act, choice.reason) == (False, "acted_before")
    (again,) = choose(ALL, "gpu07", {"10"}, {"10": job("10", start=NOW)}, done)
    assert again.act


def test_a_job_opts_out_under_all_and_in_under_opt_in_by_a_whole_word() -> None:
    assert opted("", "all") and not opted("slurm-gpu:no-requeue", "all")
    assert not opted("", "opt-in") and opted("ckpt slurm-gpu:requeue", "opt-in")
    assert not opted("xslurm-gpu:requeue", "opt-in")
    assert not opted("slurm-gpu:requeue", "off")
    listed = {"10": job("10", comment="slurm-gpu:no-requeue"),
              "11": job("11", comment="slurm-gpu:requeue")}
    assert [(c.jobid, c.act) for c in choose(ALL, "gpu07", {"10", "11"}, listed, set())] \
        == [("10", False), ("11", True)]
    opt_in = RequeuePolicy("opt-in")
    assert [(c.jobid, c.act) for c in choose(opt_in, "gpu07", {"10", "11"}, listed, set())] \
        == [("10", False), ("11", True)]


def test_after_the_grace_only_the_signalled_run_that_may_requeue_is_requeued() -> None:
    due = PendingRequeue("10@1", "10", START, NOW, "gpu07", "why")
    assert requeue_verdict([job("10")], due)[0] == "requeue"
    assert requeue_verdict([job("10", state="COMPLETED")], due)[0] == "requeue"
    assert requeue_verdict([job("10", requeue=False)], due)[0] == "no_requeue"
    assert requeue_verdict([job("10", state="CANCELLED")], due)[0] == "ended"
    assert requeue_verdict([job("10", state="PENDING")], due)[0] == "requeued_already"
    assert requeue_verdict([job("10", start=NOW)], due)[0] == "requeued_already"
    assert requeue_verdict([job("10", state="COMPLETING")], due)[0] == "wait"
    assert requeue_verdict([], due)[0] == "gone"


def test_squeue_json_gives_the_comment_and_the_requeue_flag() -> None:
    text = json.dumps({"jobs": [
        {"job_id": 5, "job_state": "RUNNING", "comment": "slurm-gpu:requeue",
         "requeue": False},
        {"job_id": 6, "job_state": "RUNNING", "requeue": "yes"}]})
    listed = parse_squeue_json(text)
    assert (listed["5"].comment, listed["5"].requeue) == ("slurm-gpu:requeue", False)
    assert (listed["6"].comment, listed["6"].requeue) == ("", None)


# --- the Slurm commands ---------------------------------------------------------------


@pytest.fixture
def fake_slurm_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """scancel and scontrol that write their arguments, one per line."""
    log = tmp_path / "argv"
    for name in ("scancel", "scontrol"):
        path = tmp_path / name
        path.write_text(f'#!/bin/sh\nprintf "%s\\n" {name} "$@" >> {log}\n')
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ.get('PATH', '')}")
    return log


@pytest.mark.process
def test_signal_and_requeue_name_one_target_in_an_argument_list(fake_slurm_bin: Path) -> None:
    actions.signal_job(SlurmJobId("31", "30", "1"), "USR1", "batch")
    actions.signal_job(SlurmJobId("41", het_job_id="40", het_job_offset="1"), "USR2", "full")
    actions.signal_job(SlurmJobId("7"), "TERM", "steps")
    actions.requeue_job(SlurmJobId("31", "30", "1"))
    assert fake_slurm_bin.read_text().split("\n")[:-1] == [
        "scancel", "--signal=USR1", "--batch", "30_1",
        "scancel", "--signal=USR2", "--full", "40",
        "scancel", "--signal=TERM", "7",
        "scontrol", "requeue", "30_1"]
    for bad in ("KILL", "USR1 --full", "-9"):
        with pytest.raises(ReportError):
            actions.signal_job(SlurmJobId("7"), bad, "batch")
    with pytest.raises(ReportError):
        actions.signal_job(SlurmJobId("7"), "USR1", "--user=root")
    with pytest.raises(ReportError):  # an array's unsplit remainder: the whole array
        actions.requeue_job(SlurmJobId("30", "30"))


# --- the Requeuer with the webhook ----------------------------------------------------


class Calls:
    """Fake Slurm commands for the Requeuer: what it signalled, requeued, recorded."""

    def __init__(self, listed: dict[str, SlurmJob]) -> None:
        self.jobs = listed
        self.signals: list[tuple[str, str, str]] = []
        self.requeues: list[str] = []
        self.records: list[tuple[str, str]] = []

    def listed(self) -> dict[str, SlurmJob]:
        return self.jobs

    def signal(self, ident: SlurmJobId, sig: str, scope: str) -> None:
        self.signals.append((ident.target or "", sig, scope))

    def requeue(self, ident: SlurmJobId) -> None:
        self.requeues.append(ident.target or "")
        self.jobs = {k: job(k, state="PENDING") if k == ident.job_id else j
                     for k, j in self.jobs.items()}

    def record(self, ident: SlurmJobId, why: str) -> None:
        self.records.append((ident.target or "", why))


def requeuer(calls: Calls, policy: RequeuePolicy, book: RequeueBook,
             samples: list[Sample], counted: list[tuple[str, str]] | None = None,
             ) -> Requeuer:
    async def query(q: str) -> list[Sample]:
        return samples

    tally = counted if counted is not None else []
    return Requeuer(policy, book, query, lambda a, r: tally.append((a, r)),
                    listed=calls.listed, signal=calls.signal, requeue=calls.requeue,
                    record=calls.record, clock=lambda: NOW)


def firing(since: float = NOW - 60) -> Firing:
    return {("SlurmGpuXidResetRequired", "gpu07:9817"): [Episode.of(LABELS, since)]}


def post_body() -> dict:
    return {"alerts": [{"status": "firing", "labels": LABELS}]}


async def settle(done: Callable[[], bool], timeout: float = 20.0) -> None:
    """Wait until ``done()`` (the requeue task ran), on a loaded machine too."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not done() and loop.time() < end:
        await asyncio.sleep(0.02)


async def _serve_posts(rem: Remediator, req: Requeuer, posts: int, fire: Firing,
                       done: Callable[[], bool] = lambda: True) -> list[dict]:
    async def confirm() -> Firing:
        return fire

    metrics = RemediateMetrics(rem.budget, lambda: NOW)
    app = make_app(rem, confirm, metrics=metrics, requeuer=req)
    answers = []
    async with TestClient(TestServer(app)) as client:
        for _ in range(posts):
            resp = await client.post("/alerts", json=post_body())
            answers.append(await resp.json())
        await settle(done)
        answers.append({"metrics": (await (await client.get("/metrics")).text())})
    await req.close()
    return answers


def remediator(state: dict[str, str]) -> Remediator:
    def drain(node: str, reason: str) -> None:
        state[node] = "MIXED+DRAIN"

    return Remediator(drain=drain, lookup=lambda n: SlurmNode(n, state.get(n, "MIXED")),
                      clock=lambda: NOW, acted_on=ActedOn(None))


def two_jobs() -> tuple[Calls, list[Sample]]:
    calls = Calls({"10": job("10"), "11": job("11"),
                   "12": job("12", requeue=False)})
    samples = [series("10", "1", "GPU-one"), series("11", "0", "GPU-zero"),
               series("12", "1", "GPU-one")]
    return calls, samples


def test_a_drain_signals_the_jobs_on_the_faulty_gpu_then_requeues_them_once() -> None:
    calls, samples = two_jobs()
    state: dict[str, str] = {}
    req = requeuer(calls, ALL, RequeueBook(None), samples)
    answers = asyncio.run(_serve_posts(remediator(state), req, 2, firing(),
                                       lambda: len(calls.records) == 2))
    assert answers[0]["results"] == ["drained gpu07"]
    assert answers[1]["results"][0].startswith("ignored: acted on this firing")
    # Job 11 is on GPU 0: never touched. Job 12 may not requeue: not signalled either.
    assert calls.signals == [("10", "USR1", "full")]
    assert calls.requeues == ["10"]
    assert [t for t, _ in calls.records] == ["10", "10"]
    assert "sent SIGUSR1" in calls.records[0][1] and "requeued at" in calls.records[1][1]
    text = answers[-1]["metrics"]
    assert 'slurm_gpu_remediate_jobs_total{action="signalled",reason="USR1"} 1.0' in text
    assert 'slurm_gpu_remediate_jobs_total{action="requeued",reason="requeued"} 1.0' in text
    assert 'slurm_gpu_remediate_jobs_total{action="skipped",reason="no_requeue"} 1.0' in text


def test_off_by_default_the_drain_signals_nothing() -> None:
    calls, samples = two_jobs()
    req = requeuer(calls, RequeuePolicy(), RequeueBook(None), samples)
    answers = asyncio.run(_serve_posts(remediator({}), req, 1, firing()))
    assert answers[0]["results"] == ["drained gpu07"]
    assert calls.signals == [] and calls.requeues == []


def test_a_new_firing_of_the_same_gpu_does_not_signal_the_same_job_twice() -> None:
    calls, samples = two_jobs()
    book = RequeueBook(None)
    state: dict[str, str] = {}
    req = requeuer(calls, RequeuePolicy("all", grace_s=60), book, samples)
    asyncio.run(_serve_posts(remediator(state), req, 1, firing(NOW - 60)))
    rem = remediator(state)  # an ECC alert on the same GPU, a minute later
    req = requeuer(calls, RequeuePolicy("all", grace_s=60), book, samples)
    asyncio.run(_serve_posts(rem, req, 1, firing(NOW - 1)))
    assert [t for t, _, _ in calls.signals] == ["10"]


def test_a_due_requeue_survives_a_restart(tmp_path: Path) -> None:
    path = requeue_state_path(tmp_path / "remediate.json")
    assert path.name == "remediate.requeue.json"
    calls, samples = two_jobs()
    req = requeuer(calls, RequeuePolicy("all", grace_s=3600), RequeueBook(path), samples)
    asyncio.run(_serve_posts(remediator({}), req, 1, firing()))
    assert calls.requeues == [] and len(RequeueBook(path).pending) == 1

    async def restarted() -> None:  # an hour later, a new process
        later = requeuer(calls, ALL, RequeueBook(path), samples)
        later.clock = lambda: NOW + 3601
        later.resume()
        await settle(lambda: bool(calls.requeues))
        await later.close()

    asyncio.run(restarted())
    assert calls.requeues == ["10"]
    book = RequeueBook(path)
    assert book.pending == {} and f"10@{START:.0f}" in book
    path.write_text("{")
    with pytest.raises(ReportError, match="cannot read the requeue state"):
        RequeueBook(path)


def test_a_failed_lookup_signals_nothing_and_is_counted() -> None:
    calls, samples = two_jobs()
    counted: list[tuple[str, str]] = []

    async def broken(q: str) -> list[Sample]:
        raise ReportError("Prometheus is down")

    req = requeuer(calls, ALL, RequeueBook(None), samples, counted)
    req.query = broken
    asyncio.run(req.on_faults([Fault("gpu07", ((EPISODE, "SlurmGpuLost"),))]))
    assert calls.signals == [] and counted == [("failed", "lookup")]


def test_bad_requeue_flags_stop_the_start(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    base = ["remediate", "--prometheus-url", "http://127.0.0.1:1", "--state-file",
            str(tmp_path / "r.json")]
    assert main([*base, "--requeue-opt", "all", "--requeue-signal", "KILL"]) == 2
    assert "bad --requeue-signal 'KILL'" in capsys.readouterr().err
    assert main([*base, "--requeue-opt", "all", "--requeue-grace", "-1"]) == 2
    assert "bad --requeue-grace" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--requeue-opt", "everyone"])


def test_a_node_already_drained_for_a_new_firing_still_signals_the_jobs_on_its_gpu() -> None:
    """An admin drained the node (maintenance) and then the GPU failed: its jobs still
    sit on a broken GPU."""
    calls, samples = two_jobs()
    req = requeuer(calls, RequeuePolicy("all", grace_s=60), RequeueBook(None), samples)
    answers = asyncio.run(_serve_posts(remediator({"gpu07": "MIXED+DRAIN"}), req, 1,
                                       firing()))
    assert answers[0]["results"] == ["ignored: gpu07 is already MIXED+DRAIN"]
    assert [t for t, _, _ in calls.signals] == ["10"]
