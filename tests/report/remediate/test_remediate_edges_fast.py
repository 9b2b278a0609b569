"""remediate at the edges the other fast tests leave: long texts cut where the code says,
posts of several nodes or alert names, the webhook's answer when the jobs' look-up fails
and its login, and the Requeuer's timing (an overdue requeue at once, a retry in 30 s)
and its loops over faults and episodes."""

from __future__ import annotations

import asyncio
import base64
import logging
from pathlib import Path
from typing import Any

import bcrypt
import pytest
from aiohttp.test_utils import TestClient, TestServer

from slurm_gpu_exporter.model.slurm_id import SlurmJobId
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.prometheus.client import Sample
from slurm_gpu_exporter.report.remediate import pending
from slurm_gpu_exporter.report.remediate.confirm import Episode, Fault, Firing
from slurm_gpu_exporter.report.remediate.memory import ActedOn
from slurm_gpu_exporter.report.remediate.pending import RequeueBook
from slurm_gpu_exporter.report.remediate.requeue_policy import RequeuePolicy, choose
from slurm_gpu_exporter.report.remediate.requeuer import requeue_verdict
from slurm_gpu_exporter.report.remediate.webhook import make_app
from slurm_gpu_exporter.report.slurm.squeue import SlurmJob
from slurm_gpu_exporter.web.config import WebConfig
from tests.report.remediate.test_remediate_requeue import settle
from tests.report.remediate.test_remediator_fast import FIRING, Slurm, _rem, alert
from tests.report.remediate.test_requeue_fast import (
    ALL,
    EPISODE,
    FAULT,
    NOW,
    START,
    _due,
    _now,
    _on,
    _requeuer,
    job,
)
from tests.report.remediate.test_requeue_fast import Slurm as Commands

REM_LOG = "slurm_gpu_exporter.report.remediate.remediator"
REQ_LOG = "slurm_gpu_exporter.report.remediate.requeuer"


# -- the Remediator ---------------------------------------------------------------------

def test_long_alert_names_and_labels_are_cut_in_the_log_and_the_answer(
        caplog: pytest.LogCaptureFixture) -> None:
    name = "A" * 300
    rem = _rem(Slurm(), allowed=frozenset({name}))
    with caplog.at_level(logging.WARNING, REM_LOG):
        out = rem.handle(alert(alertname=name), {})
        rem.handle(alert(alertname=name, instance="x" * 250), {})
    why = f"Prometheus shows no firing {name} for instance=gpu07:9817"
    assert out.text == f"refused: {why[:300]}"
    assert [r.getMessage() for r in caplog.records] == [
        f"refused {'A' * 100} (instance=gpu07:9817): {why[:300]}",
        f"refused {'A' * 100} (instance={'x' * 200}): not a node name"]


def test_a_node_slurm_does_not_list_names_every_alert_of_it(caplog: pytest.LogCaptureFixture
                                                            ) -> None:
    b = Episode.of({"alertname": "B", "instance": "node7:9817"}, NOW)
    c = Episode.of({"alertname": "C" * 250, "instance": "node7:9817"}, NOW)
    firing: Firing = {("B", "node7:9817"): [b], ("C" * 250, "node7:9817"): [c]}
    rem = _rem(Slurm(), allowed=frozenset({"B", "C" * 250}))
    with caplog.at_level(logging.WARNING, REM_LOG):
        rem.decide([alert(alertname="C" * 250, instance="node7:9817"),
                    alert(alertname="B", instance="node7:9817")], firing)
    assert [r.getMessage() for r in caplog.records] == [
        f"refused {('B, ' + 'C' * 250)[:200]} (node node7): Slurm lists no node named node7"]


def test_a_post_of_two_nodes_drains_each() -> None:
    slurm = Slurm()
    other = Episode.of({"alertname": "SlurmGpuLost", "instance": "gpu08:9817"}, NOW)
    firing = dict(FIRING) | {("SlurmGpuLost", "gpu08:9817"): [other]}
    out = _rem(slurm).decide([alert(), alert(instance="gpu08:9817")], firing)
    assert [o.text for o in out] == ["drained gpu07", "drained gpu08"]
    assert [n for n, _ in slurm.drains] == ["gpu07", "gpu08"]


@pytest.mark.parametrize(("state", "dry_run"), [("DRAIN", False), ("IDLE", True)])
def test_a_fault_is_opened_for_its_jobs_drained_or_not(state: str, dry_run: bool) -> None:
    opened: list[Any] = []
    out = _rem(Slurm(state), dry_run=dry_run,
               opening=lambda fault, now: opened.append((fault, now))).handle(alert(), FIRING)
    assert out.fault is not None and opened == [(out.fault, NOW)]


def test_a_post_of_exactly_the_cap_is_no_flood(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, REM_LOG):
        out = _rem(Slurm(), max_alerts=2).decide([alert("resolved")] * 2, {})
    assert [o.reason for o in out] == ["not_firing"] * 2 and caplog.records == []


# -- the webhook -------------------------------------------------------------------------

class _Requeuer:
    """A Requeuer whose look-up of the jobs fails."""

    count: Any = None

    async def on_faults(self, faults: list[Fault]) -> bool:
        return False


async def _firing() -> Firing:
    return FIRING


def test_a_failed_look_up_of_the_jobs_is_a_503_that_says_post_again() -> None:
    async def go() -> tuple[int, dict[str, Any], int, int]:
        app = make_app(_rem(Slurm()), _firing, requeuer=_Requeuer())  # type: ignore[arg-type]
        async with TestClient(TestServer(app)) as client:
            resp = await client.post("/alerts", json={"alerts": [alert()]})
            healthy = await client.get("/-/healthy")
            return resp.status, await resp.json(), healthy.status, len(await healthy.text())
    assert asyncio.run(go()) == (503, {"results": [
        "drained gpu07", "failed: cannot look up the jobs on the faulty GPU; post again"]},
        200, 8)


def test_the_webhook_asks_for_a_login_in_remediates_name_but_not_for_health() -> None:
    config = WebConfig(users={"am": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4))})

    async def go() -> tuple[int, str, int, int]:
        app = make_app(_rem(Slurm()), _firing, web_config=config)
        async with TestClient(TestServer(app)) as client:
            refused = await client.post("/alerts", json={"alerts": []})
            login = "Basic " + base64.b64encode(b"am:s3cret").decode()
            ok = await client.post("/alerts", json={"alerts": []},
                                   headers={"Authorization": login})
            health = await client.get("/-/healthy")
            return (refused.status, refused.headers.get("WWW-Authenticate", ""), ok.status,
                    health.status)
    assert asyncio.run(go()) == (401, 'Basic realm="slurm-gpu-report remediate"', 200, 200)


def test_prometheus_that_cannot_confirm_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def down() -> Firing:
        raise ReportError("cannot reach Prometheus at http://p:9090 (\x1b)", 3)

    async def go() -> int:
        async with TestClient(TestServer(make_app(_rem(Slurm()), down))) as client:
            return (await client.post("/alerts", json={"alerts": [alert()]})).status
    with caplog.at_level(logging.ERROR, "slurm_gpu_exporter.report.remediate.webhook"):
        assert asyncio.run(go()) == 503
    assert [r.getMessage() for r in caplog.records] == [
        "cannot confirm alerts with Prometheus, nothing drained: cannot reach Prometheus at "
        "http://p:9090 (\ufffd)"]


# -- which jobs, after the grace -------------------------------------------------------

def test_every_job_on_the_gpu_is_looked_at_whatever_comes_first() -> None:
    lead = job("40", ident=SlurmJobId("40", het_job_id="40", het_job_offset="0"))
    part = job("41", ident=SlurmJobId("41", het_job_id="40", het_job_offset="1"))
    listed = {"40": lead, "41": part, "5": job("5", nodes=("gpu08", "gpu09")),
              "6": job("6", batch=False), "7": job("7", requeue=False),
              "8": job("8", comment="slurm-gpu:no-requeue"), "9": job("9")}
    done = {f"9@{START:.0f}"}
    choices = choose(ALL, "gpu07", {"1", "40", "41", "5", "6", "7", "8", "9"}, listed, done)
    assert [(c.jobid, c.reason, c.target) for c in choices] == [
        ("1", "not_listed", ""), ("5", "not_on_node", ""), ("6", "not_batch", "6"),
        ("7", "no_requeue", "7"), ("8", "opted_out", "8"), ("9", "acted_before", "9"),
        ("40", "picked", "40")]
    assert choices[1].text == "job 5: Slurm lists it RUNNING on gpu08,gpu09, not running on gpu07"


def test_after_the_grace_a_listing_without_identity_or_a_long_state_is_read() -> None:
    odd = SlurmJob("40", "alice", "a", "p", "q", "n", "RUNNING", ("gpu07",), 1, START)
    assert requeue_verdict([job("40", state="X" * 50), odd], _due()) == ("ended",
                                                                           "it ended " + "X" * 40)


# -- the Requeuer: texts, loops and timing ---------------------------------------------

def test_a_long_alert_name_is_cut_in_the_comment_and_the_log(caplog: pytest.LogCaptureFixture
                                                             ) -> None:
    slurm = Commands({"40": job("40")})
    long_fault = Fault("gpu07", ((EPISODE, "A" * 500),))
    with caplog.at_level(logging.INFO, REQ_LOG):
        _on(_requeuer(slurm), [long_fault])
    why = slurm.calls[1][2]
    assert len(why) == 400 and why.startswith("slurm-gpu-exporter: AAA")
    assert caplog.records[-1].getMessage() == f"sent SIGUSR1 to job 40 (full): {why[:300]}"
    caplog.clear()
    with caplog.at_level(logging.INFO, REQ_LOG):
        _on(_requeuer(Commands({"40": job("40")}), dry_run=True), [long_fault])
    assert caplog.records[-1].getMessage() == f"dry run: would send SIGUSR1 to job 40 ({why[:300]})"


def test_a_failed_signal_of_a_long_error_is_cut_in_the_comment() -> None:
    slurm = Commands({"40": job("40")})

    def fails(ident: SlurmJobId, sig: str, scope: str) -> None:
        raise ReportError("e" * 200)
    req = _requeuer(slurm)
    req.signal = fails
    _on(req, [Fault("gpu07", ((EPISODE, "A" * 300),))])
    (why,) = [c[2] for c in slurm.calls if c[0] == "record"]
    assert len(why) == 400
    short = _requeuer(slurm2 := Commands({"40": job("40")}))
    short.signal = fails
    _on(short, [FAULT])
    (text,) = [c[2] for c in slurm2.calls if c[0] == "record"]
    assert text.endswith(f"SIGUSR1 failed ({'e' * 120}), not requeued")


def test_every_episode_of_a_fault_is_looked_at(caplog: pytest.LogCaptureFixture) -> None:
    bare = Episode.of({"alertname": "SlurmGpuLost", "host": "gpu07", "uuid": "GPU-two"}, NOW)
    asked: list[str] = []

    async def query(q: str) -> list[Sample]:
        asked.append(q)
        return [Sample({"jobid": "41" if "host" in q else "40", "gpu": "1",
                        "uuid": "GPU-two" if "host" in q else "GPU-one"}, NOW)]
    slurm = Commands({"40": job("40"), "41": job("41")})
    req = _requeuer(slurm)
    req.query, req.node_label = query, "host"
    with caplog.at_level(logging.INFO, REQ_LOG):
        _on(req, [Fault("gpu07", ((EPISODE, "SlurmGpuLost"), (bare, "SlurmGpuLost")))])
    assert asked == ['timestamp(slurm_job_gpu_allocated_seconds_total{instance="gpu07:9817"})',
                     'timestamp(slurm_job_gpu_allocated_seconds_total{host="gpu07"})']
    assert [c[1] for c in slurm.calls if c[0] == "signal"] == ["40", "41"]
    assert "on gpu07 gpu 1 GPU-one, gpu _ GPU-two since" in slurm.calls[1][2]


def test_a_failed_fault_leaves_the_next_one_to_be_worked() -> None:
    slurm = Commands({"40": job("40")})
    tries = iter([ReportError("squeue failed"), None])
    listed = slurm.listed

    def flaky() -> dict[str, SlurmJob]:
        fail = next(tries)
        if fail is not None:
            raise fail
        return listed()
    req = _requeuer(slurm)
    req.listed = flaky
    second = Episode.of({"instance": "gpu07:9817", "gpu": "1", "uuid": "GPU-one"}, NOW)
    closed = Fault("gpu07", ((Episode.of({"gpu": "9"}, NOW), "X"),), repeat=True)
    assert _on(req, [closed, FAULT, Fault("gpu07", ((second, "X"),))]) is False
    assert [c[0] for c in slurm.calls] == ["signal", "record"]


def test_a_repeat_works_the_episodes_left_open_whatever_their_order() -> None:
    book = RequeueBook(None)
    book.opened([EPISODE], NOW - 60)
    closed = Episode.of({"gpu": "9"}, NOW)
    slurm = Commands({"40": job("40")})
    _on(_requeuer(slurm, book=book), [Fault("gpu07", ((closed, "X"), (EPISODE, "A")),
                                            repeat=True)])
    assert slurm.calls[0] == ("signal", "40", "USR1", "full")


def test_an_overdue_requeue_runs_at_once_after_a_restart() -> None:
    slurm = Commands({"40": job("40")})
    book = RequeueBook(None)
    book.acted("k", NOW, _due(due=NOW - 10))

    async def go() -> list[tuple[str, ...]]:
        req = _requeuer(slurm, book=book)
        req.resume()
        await settle(lambda: bool(slurm.calls), timeout=0.5)  # "at once", not after 1 s
        await req.close()
        return slurm.calls
    assert asyncio.run(go())[0] == ("requeue", "40")


def test_a_retry_waits_its_30_seconds() -> None:
    slurm = Commands({"40": job("40")})
    slurm.fail.add("requeue")
    tries: list[int] = []
    original = slurm.requeue

    def counting(ident: SlurmJobId) -> None:
        tries.append(1)
        original(ident)

    async def go() -> int:
        req = _requeuer(slurm)
        req.requeue = counting
        await req.requeue_now(_due(due=NOW))
        await asyncio.sleep(0.1)  # a retry due now would have run by then
        await req.close()
        return len(tries)
    assert asyncio.run(go()) == 1


def test_a_job_still_completing_past_the_retries_is_given_up_in_words(
        caplog: pytest.LogCaptureFixture) -> None:
    slurm = Commands({"40": job("40", state="COMPLETING"),
                      "x": SlurmJob("x", "u", "a", "p", "q", "n", start=START)})
    with caplog.at_level(logging.ERROR, REQ_LOG):
        assert _now(_requeuer(slurm), _due(due=NOW - 3600)) == []
    assert [r.getMessage() for r in caplog.records] == [
        "gave up requeueing job 40: it is still completing for 1800 s past its due time "
        "(requeue it by hand: scontrol requeue 40)"]


# -- the state files' failures ------------------------------------------------------------

def test_state_files_that_cannot_be_written_say_what_a_restart_would_do(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "file").write_text("")
    acted, book = ActedOn(None), RequeueBook(None)
    acted.path = book.path = tmp_path / "file" / "state.json"
    with caplog.at_level(logging.ERROR):
        acted.remember([EPISODE], NOW)
        book.acted("k", NOW, None)
    assert [r.getMessage() for r in caplog.records] == [
        f"cannot write the remediate state in {tmp_path}/file: File exists: after a restart "
        "remediate would drain for these alerts again",
        f"cannot write the requeue state in {tmp_path}/file: File exists: after a restart "
        "remediate would lose its due requeues"]


def test_the_book_keeps_the_newest_of_three_over_a_cap_of_two(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pending, "MAX_KEYS", 2)
    book = RequeueBook(None)
    book.acted("a", NOW, None)
    book.acted("b", NOW + 1, None)
    book.acted("c", NOW + 2, None)
    assert set(book.done) == {"b", "c"}


def test_off_nothing_is_asked() -> None:
    slurm = Commands({"40": job("40")})
    assert _on(_requeuer(slurm, RequeuePolicy("off")), [FAULT]) is True


def test_the_webhooks_guard_keeps_the_listeners_limits() -> None:
    from slurm_gpu_exporter.web.connections import ConnectionLimits
    from slurm_gpu_exporter.web.middleware import GUARD_KEY

    guard = make_app(_rem(Slurm()), _firing)[GUARD_KEY]
    assert guard.limits == ConnectionLimits()
