"""remediate's requeue when something fails: the requeue flags need --requeue-opt; an
episode's requeue work stays open until each job on the faulty GPU was decided (a
failed look-up, a restart: the next post acts); a job's decision is written before
its signal (a crash after the signal still requeues it, once); only jobs Slurm can
requeue are signalled; a failed signal is never followed by a requeue; a failed requeue
is retried past a slurmctld failover; what ends during the grace decides the requeue;
the opt words are whole words in any case."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from slurm_gpu_exporter.report.cli.main import main
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.prometheus.client import Sample
from slurm_gpu_exporter.report.remediate.confirm import Fault
from slurm_gpu_exporter.report.remediate.memory import ActedOn
from slurm_gpu_exporter.report.remediate.pending import (
    REOPEN_S,
    PendingRequeue,
    RequeueBook,
    requeue_state_path,
)
from slurm_gpu_exporter.report.remediate.remediator import Remediator
from slurm_gpu_exporter.report.remediate.requeue_policy import RequeuePolicy, choose, opted
from slurm_gpu_exporter.report.remediate.requeuer import RETRY_FOR_S
from slurm_gpu_exporter.report.slurm.actions import SlurmNode
from slurm_gpu_exporter.report.slurm.squeue import parse_squeue_json
from tests.report.remediate.test_remediate_requeue import (
    ALL,
    EPISODE,
    NOW,
    START,
    Calls,
    _serve_posts,
    firing,
    job,
    requeuer,
    series,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
KEY = f"10@{START:.0f}"


def on_gpu(*jobs: str) -> list[Sample]:
    return [series(j, "1", "GPU-one") for j in jobs]


def fault(repeat: bool = False) -> Fault:
    return Fault("gpu07", ((EPISODE, "SlurmGpuXidResetRequired"),), repeat)


# --- 1. the requeue flags need --requeue-opt ---------------------------------------------


@pytest.mark.parametrize("flags", [["--requeue-signal", "USR1"], ["--requeue-grace", "30"],
                                   ["--requeue-opt", "off", "--requeue-signal", "USR2"]])
def test_a_requeue_flag_without_requeue_opt_stops_the_start(
        flags: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # An exposed listener would stop the start too, later and for another reason.
    argv = ["remediate", "--prometheus-url", "http://127.0.0.1:1", "--state-file",
            str(tmp_path / "r.json"), "--web.listen-address", "0.0.0.0:1", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "without --requeue-opt" in err and flags[-2] in err, err


# --- 2. at least once, never twice ----------------------------------------------------------


class Killed(BaseException):
    """remediate dies here (the process is killed): nothing after it runs."""


def test_a_kill_between_the_signal_and_its_record_still_requeues_once_after_a_restart(
        tmp_path: Path) -> None:
    path = requeue_state_path(tmp_path / "remediate.json")
    calls = Calls({"10": job("10")})

    def signal_then_die(ident: object, sig: str, scope: str) -> None:
        calls.signals.append(("10", sig, scope))
        raise Killed

    first = requeuer(calls, RequeuePolicy("all", grace_s=60), RequeueBook(path), on_gpu("10"))
    first.signal = signal_then_die
    with pytest.raises(Killed):
        asyncio.run(first.on_faults([fault()]))
    assert calls.signals == [("10", "USR1", "full")]

    async def restarted() -> None:  # a new process, past the grace
        later = requeuer(calls, ALL, RequeueBook(path), on_gpu("10"))
        later.clock = lambda: NOW + 61
        later.resume()
        await asyncio.gather(*later._tasks)
        # The post comes again (the episode was left open): the job is not signalled
        # twice, and a second look at the due requeue finds the run requeued already.
        assert await later.on_faults([fault(repeat=True)])
        await later.requeue_now(PendingRequeue(KEY, "10", START, NOW, "gpu07", "why"))
        await later.close()

    asyncio.run(restarted())
    assert calls.signals == [("10", "USR1", "full")] and calls.requeues == ["10"]
    book = RequeueBook(path)
    assert book.pending == {} and KEY in book and book.open == {}


class Flaky:
    """A look-up that fails ``times`` times, then answers."""

    def __init__(self, times: int, answer: object) -> None:
        self.left, self.answer = times, answer

    def __call__(self, *args: object) -> object:
        if self.left > 0:
            self.left -= 1
            raise ReportError("Slurm or Prometheus is down")
        return self.answer


@pytest.mark.parametrize("broken", ["holders", "squeue"])
def test_a_failed_lookup_leaves_the_episode_open_and_the_repeat_post_acts(
        broken: str) -> None:
    calls = Calls({"10": job("10")})
    req = requeuer(calls, ALL, RequeueBook(None), on_gpu("10"))
    if broken == "squeue":
        req.listed = Flaky(1, calls.jobs)  # type: ignore[assignment]
    else:
        flaky = Flaky(1, on_gpu("10"))

        async def query(q: str) -> list[Sample]:
            return flaky(q)  # type: ignore[return-value]

        req.query = query
    state: dict[str, str] = {}
    answers = asyncio.run(_serve_posts(_remediator(state), req, 3, firing(),
                                       lambda: bool(calls.requeues)))
    assert answers[0]["results"][0] == "drained gpu07"
    assert "cannot look up the jobs" in answers[0]["results"][-1]
    assert answers[1]["results"][0].startswith("ignored: acted on this firing")
    assert calls.signals == [("10", "USR1", "full")] and calls.requeues == ["10"]
    assert len(answers[2]["results"]) == 1  # the third post: nothing left to do
    assert 'action="failed",reason="lookup"} 1.0' in answers[-1]["metrics"]


def test_a_restart_after_a_failed_lookup_acts_on_the_repeat_post(tmp_path: Path) -> None:
    state_file = tmp_path / "remediate.json"
    path = requeue_state_path(state_file)
    calls = Calls({"10": job("10")})
    nodes: dict[str, str] = {}

    def wired(book: RequeueBook) -> Remediator:
        rem = _remediator(nodes, ActedOn(state_file))
        rem.opening = lambda f, now: book.opened((e for e, _ in f.episodes), now)
        return rem

    book = RequeueBook(path)
    req = requeuer(calls, ALL, book, on_gpu("10"))
    req.listed = Flaky(1, calls.jobs)  # type: ignore[assignment]
    asyncio.run(_serve_posts(wired(book), req, 1, firing()))
    assert nodes == {"gpu07": "MIXED+DRAIN"} and calls.signals == []
    book = RequeueBook(path)  # restarted: the drain is remembered, the episode open
    req = requeuer(calls, ALL, book, on_gpu("10"))
    answers = asyncio.run(_serve_posts(wired(book), req, 1, firing(),
                                       lambda: bool(calls.requeues)))
    assert answers[0]["results"][0].startswith("ignored: acted on this firing")
    assert calls.signals == [("10", "USR1", "full")] and calls.requeues == ["10"]


def test_an_episode_acted_on_before_is_not_reopened_and_an_old_open_one_is_given_up(
        ) -> None:
    calls = Calls({"10": job("10")})
    counted: list[tuple[str, str]] = []
    req = requeuer(calls, ALL, RequeueBook(None), on_gpu("10"), counted)
    assert asyncio.run(req.on_faults([fault(repeat=True)]))  # not open: done before
    req.book.opened([EPISODE], NOW - REOPEN_S)
    assert asyncio.run(req.on_faults([fault(repeat=True)]))
    assert calls.signals == [] and ("failed", "gave_up") in counted
    assert req.book.open == {}


# --- 3. only what Slurm can requeue; a failed signal; retries --------------------------------


def test_interactive_and_no_requeue_jobs_are_not_signalled() -> None:
    listed = {"10": job("10", batch=False), "11": job("11", requeue=False),
              "12": job("12", batch=None), "13": job("13", requeue=None), "14": job("14")}
    choices = choose(ALL, "gpu07", set(listed), listed, set())
    assert [(c.jobid, c.act, c.reason) for c in choices] == [
        ("10", False, "not_batch"), ("11", False, "no_requeue"), ("12", False, "not_batch"),
        ("13", False, "no_requeue"), ("14", True, "picked")]
    calls = Calls(listed)
    asyncio.run(requeuer(calls, ALL, RequeueBook(None), on_gpu(*listed)).on_faults([fault()]))
    assert [t for t, _, _ in calls.signals] == ["14"]


def test_squeue_json_gives_the_batch_flag() -> None:
    text = json.dumps({"jobs": [{"job_id": 5, "batch_flag": False},
                                {"job_id": 6, "batch_flag": True}, {"job_id": 7}]})
    listed = parse_squeue_json(text)
    assert [listed[j].batch for j in ("5", "6", "7")] == [False, True, None]
    real = parse_squeue_json((FIXTURES / "slurm-22.05" / "squeue.json").read_text())
    assert real and all(j.batch is True for j in real.values())


def test_a_failed_signal_is_recorded_and_never_followed_by_a_requeue() -> None:
    calls = Calls({"10": job("10")})
    counted: list[tuple[str, str]] = []
    req = requeuer(calls, RequeuePolicy("all", grace_s=0), RequeueBook(None), on_gpu("10"),
                   counted)

    def refused(*args: object) -> None:
        raise ReportError("scancel --signal failed: Invalid job id specified")

    req.signal = refused

    async def run() -> None:
        await req.on_faults([fault()])
        await asyncio.sleep(0.05)
        await req.close()

    asyncio.run(run())
    assert calls.requeues == [] and ("failed", "signal") in counted
    assert req.book.pending == {} and KEY in req.book
    ((target, why),) = calls.records
    assert target == "10" and "SIGUSR1 failed" in why and "not requeued" in why


class Ticking:
    """A clock that moves 31 s at each reading: the retries' waits pass at once."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        self.now += 31
        return self.now


@pytest.mark.parametrize("down_for", [15 * 60.0, None])
def test_a_failed_requeue_is_retried_past_a_slurmctld_failover(down_for: float | None) -> None:
    calls = Calls({"10": job("10")})
    counted: list[tuple[str, str]] = []
    req = requeuer(calls, ALL, RequeueBook(None), on_gpu("10"), counted)
    req.clock = clock = Ticking()
    up = calls.requeue

    def requeue(ident: object) -> None:
        if down_for is None or clock.now < NOW + down_for:
            raise ReportError("scontrol requeue failed: Unable to contact slurm controller")
        up(ident)  # type: ignore[arg-type]

    req.requeue = requeue
    due = PendingRequeue(KEY, "10", START, NOW, "gpu07", "requeue due")
    req.book.acted(KEY, NOW, due)

    async def run() -> None:
        req.schedule(due)
        while req._tasks:
            await asyncio.gather(*list(req._tasks))

    asyncio.run(run())
    if down_for is None:  # given up once RETRY_FOR_S passed, not before
        assert calls.requeues == [] and ("failed", "gave_up") in counted
        assert NOW + RETRY_FOR_S - 60 < clock.now < NOW + RETRY_FOR_S + 200
    else:
        assert calls.requeues == ["10"]
    assert req.book.pending == {}


# --- 4. what ended during the grace ---------------------------------------------------------


@pytest.mark.parametrize(("state", "requeued"), [
    ("RUNNING", True), ("COMPLETED", True), ("FAILED", True), ("NODE_FAIL", True),
    ("CANCELLED", False), ("TIMEOUT", False), ("OUT_OF_MEMORY", False),
    ("PREEMPTED", False)])
def test_after_the_grace_a_job_that_ended_on_its_own_is_requeued_a_cancelled_one_not(
        state: str, requeued: bool) -> None:
    calls = Calls({"10": job("10", state=state)})
    counted: list[tuple[str, str]] = []
    req = requeuer(calls, ALL, RequeueBook(None), on_gpu("10"), counted)
    asyncio.run(req.requeue_now(PendingRequeue(KEY, "10", START, NOW, "gpu07", "why")))
    assert calls.requeues == (["10"] if requeued else [])
    assert (("skipped", "ended") in counted) is not requeued


# --- 5. the opt words -----------------------------------------------------------------------


@pytest.mark.parametrize(("comment", "out"), [
    ("SLURM-GPU:NO-REQUEUE", True), ("slurm-gpu:no-requeue.", True),
    ("ckpt=yes,Slurm-GPU:No-Requeue;", True), ("(slurm-gpu:no-requeue)", True),
    ('"slurm-gpu:no-requeue"', True),
    ("slurm-gpu:no-requeue-please", False), ("xslurm-gpu:no-requeue", False),
    ("slurm-gpu:no-requeue_x", False), ("my-slurm-gpu:no-requeue", False),
    ("a:slurm-gpu:no-requeue", False), ("slurm-gpu:no-requeue2", False), ("", False)])
def test_the_opt_out_word_is_a_whole_word_in_any_case(comment: str, out: bool) -> None:
    assert opted(comment, "all") is not out


@pytest.mark.parametrize(("comment", "opted_in"), [
    ("SLURM-GPU:REQUEUE", True), ("slurm-gpu:requeue.", True), ("ckpt,slurm-gpu:requeue", True),
    ("slurm-gpu:requeue-later", False), ("xslurm-gpu:requeue", False),
    ("slurm-gpu:requeued", False), ("slurm-gpu:no-requeue", False),
    ("slurm-gpu:requeue slurm-gpu:NO-requeue", False)])
def test_the_opt_in_word_is_a_whole_word_in_any_case(comment: str, opted_in: bool) -> None:
    assert opted(comment, "opt-in") is opted_in


def _remediator(state: dict[str, str], acted_on: ActedOn | None = None) -> Remediator:
    def drain(node: str, reason: str) -> None:
        state[node] = "MIXED+DRAIN"

    return Remediator(drain=drain, lookup=lambda n: SlurmNode(n, state.get(n, "MIXED")),
                      clock=lambda: NOW, acted_on=ActedOn(None) if acted_on is None else acted_on)
