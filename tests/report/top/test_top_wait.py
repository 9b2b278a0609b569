"""``top`` on a job Prometheus does not hold yet: which jobs it waits for (as Slurm lists
them), for how long, what it says, and that another user's job is refused before any
wait. Slurm's listing, Prometheus's answers, the clock and the sleep are injected."""

from __future__ import annotations

import asyncio
import functools
import os
import pwd
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from slurm_gpu_exporter.model.slurm_id import SlurmJobId
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.shapes import GpuDetail, JobDetail, JobUsage, NodeDetail
from slurm_gpu_exporter.report.slurm.squeue import SlurmJob
from slurm_gpu_exporter.report.top.now import JobNow
from slurm_gpu_exporter.report.top.wait import (
    SlurmSays,
    first_sample,
    no_sample_hint,
    wait_left,
    waiting_line,
)

NOW = 10_000.0
ME = pwd.getpwuid(os.getuid()).pw_name


@dataclass
class FakeTime:
    """A clock that moves only when ``sleep`` is awaited."""

    now: float = NOW
    slept: list[float] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _running(start: float | None = NOW - 5, state: str = "RUNNING") -> SlurmSays:
    return SlurmSays("4242", "dana", state, start)


# -- which jobs wait, and for how long ------------------------------------------------

def test_a_running_job_is_waited_for_until_the_bound_after_its_start() -> None:
    assert wait_left(_running(NOW - 20), 60, NOW) == 40
    assert wait_left(_running(NOW - 20, "CONFIGURING"), 60, NOW) == 40
    assert wait_left(_running(None), 60, NOW) == 60  # start not said: the whole bound
    assert wait_left(_running(NOW + 30), 60, NOW) == 60  # Slurm's clock ahead: no more


def test_a_job_that_has_run_longer_than_the_bound_does_not_wait() -> None:
    """Its first sample would be there: an agent that is not sampling it, or a filter,
    is not fixed by waiting."""
    assert wait_left(_running(NOW - 60), 60, NOW) == 0
    assert wait_left(_running(NOW - 3600), 60, NOW) == 0


def test_a_pending_job_waits_the_whole_bound_from_now() -> None:
    # a pending job's start is Slurm's guess (or 0): it does not shorten the wait
    assert wait_left(_running(NOW - 3600, "PENDING"), 60, NOW) == 60
    assert wait_left(_running(NOW + 7200, "PENDING"), 60, NOW) == 60


@pytest.mark.parametrize("state", ["COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
                                   "COMPLETING", "SUSPENDED", "PREEMPTED", ""])
def test_a_job_in_a_state_that_brings_no_sample_does_not_wait(state: str) -> None:
    assert wait_left(_running(NOW - 1, state), 60, NOW) == 0


def test_a_job_slurm_does_not_list_or_a_zero_bound_does_not_wait() -> None:
    assert wait_left(None, 60, NOW) == 0
    assert wait_left(_running(NOW - 1), 0, NOW) == 0


def test_the_waiting_line_and_the_hint_say_what_slurm_said() -> None:
    assert waiting_line("4242_3", _running(), 55.4) == (
        "job 4242_3 is running; waiting for its first sample in Prometheus "
        "(up to 55 s, --wait)")
    assert "job 7 is pending; waiting for it to start" in waiting_line(
        "7", _running(state="PENDING"), 60)
    assert "Slurm runs it, yet no sample came within 60 s of its start" in no_sample_hint(
        _running(), 60)
    assert "it was pending in Slurm" in no_sample_hint(_running(state="PENDING"), 60)
    assert no_sample_hint(None, 60) == ""
    assert no_sample_hint(_running(state="COMPLETED"), 60) == ""


# -- the wait itself ------------------------------------------------------------------

def _probe(answers: list[str | None], calls: list[float], clock: FakeTime
           ) -> Callable[[], Awaitable[str | None]]:
    async def probe() -> str | None:
        calls.append(clock.now)
        return answers.pop(0) if answers else None
    return probe


def test_the_wait_polls_every_interval_until_the_first_answer() -> None:
    fake, calls = FakeTime(), []
    got = asyncio.run(first_sample(_probe([None, None, "frame"], calls, fake), 60, 5,
                                   clock=fake.clock, sleep=fake.sleep))
    assert got == "frame"
    assert calls == [NOW + 5, NOW + 10, NOW + 15]


def test_the_wait_ends_at_the_bound_with_a_last_try_there() -> None:
    fake, calls = FakeTime(), []
    got = asyncio.run(first_sample(_probe([], calls, fake), 12, 5, clock=fake.clock,
                                   sleep=fake.sleep))
    assert got is None
    assert fake.slept == [5, 5, 2] and calls[-1] == NOW + 12


# -- the command: Slurm's listing and Prometheus's answers injected -------------------

def _detail(jobid: str) -> JobDetail:
    return JobDetail(usage=JobUsage(jobid, user=ME, gpus=1, start=time.time() - 5),
                     nodes=[NodeDetail("gpu01:9817", gpus=[GpuDetail("0", "GPU-a",
                                                                     allocated_s=5)])],
                     accounting=None, now=time.time())


@dataclass
class World:
    """What ``top`` sees: Slurm's listing and when Prometheus first knows the job."""

    listing: dict[str, SlurmJob] | ReportError = field(default_factory=dict)
    known_after: int | None = 0  # job_report calls that answer "unknown" first; None: all
    known_as: str = "4242"  # the id Prometheus knows the job by
    owner: str | None = None  # who sacct says owns it (None: sacct does not know it)
    asked: list[str] = field(default_factory=list)  # the ids job_report was asked
    squeue_calls: int = 0
    time: FakeTime = field(default_factory=FakeTime)


def _job(jobid: str = "4242", user: str = ME, state: str = "RUNNING",
         start: float | None = None, ident: SlurmJobId | None = None) -> SlurmJob:
    return SlurmJob(jobid=jobid, user=user, account="ml", partition="gpu", qos="normal",
                    name="train", state=state, start=time.time() - 2 if start is None
                    else start, ident=ident or SlurmJobId(jobid))


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> World:
    from slurm_gpu_exporter.report.cli import reports, top

    here = World()

    async def same_ids(_prom: object, _window: object, ids: list[str], _f: object
                       ) -> list[str]:
        return ids

    async def job_report(_prom: object, _window: object, ids: list[str], *_: object
                         ) -> tuple[list[JobDetail], list[str]]:
        here.asked.append(ids[0])
        tries = len(here.asked)
        if here.known_after is None or tries <= here.known_after or ids[0] != here.known_as:
            return [], ids
        return [_detail(ids[0])], []

    async def fetch_now(*_: object) -> JobNow:
        return JobNow(last_sample=time.time())

    def listed_jobs() -> dict[str, SlurmJob]:
        here.squeue_calls += 1
        if isinstance(here.listing, ReportError):
            raise here.listing
        return here.listing

    monkeypatch.setattr(top, "resolve_array_tasks", same_ids)
    monkeypatch.setattr(top, "job_report", job_report)
    monkeypatch.setattr(top, "fetch_now", fetch_now)
    monkeypatch.setattr(top, "listed_jobs", listed_jobs)
    monkeypatch.setattr(top, "first_sample", functools.partial(
        first_sample, clock=here.time.clock, sleep=here.time.sleep))
    monkeypatch.setattr(reports, "sacct_owners",
                        lambda ids: {i: here.owner for i in ids} if here.owner else {})
    monkeypatch.setenv("SLURM_GPU_REPORT_CLIENT", "/nonexistent")
    return here


def _top(*args: str) -> int:
    from slurm_gpu_exporter.report.cli import main

    return main.main(["top", *args, "--once", "--prometheus-url", "http://127.0.0.1:9"])


def test_top_right_after_sbatch_waits_for_the_first_sample_then_shows_the_frame(
        world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.listing, world.known_after = {"4242": _job()}, 3
    assert _top("4242") == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "job 4242 is running; waiting for its first sample in Prometheus (up to 58 s, --wait)"]
    assert out.startswith("Job 4242") and "gpu01:9817" in out, out
    assert world.time.slept == [5.0, 5.0, 5.0]  # --interval apart, until it answered


def test_a_job_whose_first_sample_never_comes_is_unknown_after_the_bound_with_a_hint(
        world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.listing, world.known_after = {"4242": _job()}, None
    assert _top("4242", "--wait", "30", "--interval", "10") == 5
    err = capsys.readouterr().err
    assert "is running; waiting for its first sample in Prometheus (up to 28 s" in err
    assert ("no metrics for job 4242 in Prometheus in the window; check the id, or widen it "
            "with --since; Slurm runs it, yet no sample came within 30 s of its start") in err
    assert 27.5 < sum(world.time.slept) < 28.5 and world.time.slept[:2] == [10.0, 10.0]


def test_a_pending_job_is_waited_for_and_said_pending(
        world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.listing = {"4242": _job(state="PENDING", start=time.time() + 3600)}
    world.known_after = None
    assert _top("4242", "--wait", "20") == 5
    err = capsys.readouterr().err
    assert "job 4242 is pending; waiting for it to start and send its first sample" in err
    assert "it was pending in Slurm: run top again once squeue shows it running" in err
    assert sum(world.time.slept) == 20


@pytest.mark.parametrize(("listing", "args"), [
    ({}, ()),  # Slurm does not list it: unknown, long finished
    (ReportError("squeue is not installed or not on PATH", 8), ()),  # cannot ask Slurm
    ({"4242": _job(state="COMPLETED")}, ()),  # ended a moment ago, never sampled
    ({"4242": _job()}, ("--wait", "0")),  # told not to wait
])
def test_a_job_that_will_bring_no_sample_is_unknown_at_once_as_before(
        world: World, capsys: pytest.CaptureFixture[str],
        listing: dict[str, SlurmJob] | ReportError, args: tuple[str, ...]) -> None:
    world.listing, world.known_after = listing, None
    assert _top("4242", *args) == 5
    err = capsys.readouterr().err
    assert "waiting" not in err and world.time.slept == [] and world.asked == ["4242"]
    assert "no metrics for job 4242 in Prometheus" in err, err
    assert ("Slurm runs it" in err) == ("--wait" in args), err


def test_a_job_slurm_has_run_longer_than_the_bound_is_unknown_at_once_with_a_hint(
        world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.listing = {"4242": _job(start=time.time() - 600)}
    world.known_after = None
    assert _top("4242") == 5
    err = capsys.readouterr().err
    assert world.time.slept == [] and "waiting" not in err
    assert "Slurm runs it, yet no sample came within 60 s of its start: check that " \
           "slurm-gpu-exporter runs on its nodes" in err, err


def test_an_array_task_prometheus_does_not_know_yet_is_followed_by_its_own_id(
        world: World, capsys: pytest.CaptureFixture[str]) -> None:
    task = _job("4250", ident=SlurmJobId("4250", array_job_id="4242", array_task_id="3"))
    world.listing, world.known_as, world.known_after = {"4250": task}, "4250", 1
    assert _top("4242_3") == 0
    out, err = capsys.readouterr()
    assert "job 4242_3 is running; waiting" in err
    assert world.asked == ["4242_3", "4250"] and out.startswith("Job 4250"), out


@pytest.mark.parametrize(("sacct_owner", "slurm_user", "squeue_calls"), [
    ("someone-else", "someone-else", 0),  # sacct knows the owner: refused as today
    (None, "someone-else", 1),  # only squeue knows it yet: its owner, before any wait
])
def test_another_users_job_is_refused_before_any_wait(
        world: World, capsys: pytest.CaptureFixture[str], sacct_owner: str | None,
        slurm_user: str, squeue_calls: int) -> None:
    world.listing, world.known_after = {"4242": _job(user=slurm_user)}, None
    world.owner = sacct_owner
    assert _top("4242", "--auth", "munge") == 10
    err = capsys.readouterr().err
    assert f"job 4242 is not yours ({ME}): the proxy shows each user only" in err, err
    assert "waiting" not in err and world.time.slept == [] and world.asked == ["4242"]
    assert world.squeue_calls == squeue_calls


@pytest.mark.parametrize("slurm_user", [ME, ""])  # "": Slurm's answer did not say
def test_ones_own_job_through_the_proxy_is_waited_for(
        world: World, capsys: pytest.CaptureFixture[str], slurm_user: str) -> None:
    world.listing, world.known_after = {"4242": _job(user=slurm_user)}, 1
    assert _top("4242", "--auth", "munge") == 0
    assert "job 4242 is running; waiting" in capsys.readouterr().err


@pytest.mark.parametrize("wait", ["-1", "nan", "inf"])
def test_a_bad_wait_is_refused(world: World, capsys: pytest.CaptureFixture[str],
                               wait: str) -> None:
    assert _top("4242", "--wait", wait) == 2
    assert "bad --wait" in capsys.readouterr().err and world.asked == []
