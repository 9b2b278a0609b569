"""remediate's drain decision and its webhook, in words: every outcome's answer and
counter reason, what is logged where it acted or refused, the reason Slurm records, the
fault handed on for the jobs on the GPU, and the webhook's answers to bad posts, with
Slurm and Prometheus as fakes and a set clock."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.remediate.budget import DrainBudget
from slurm_gpu_exporter.report.remediate.confirm import Episode, Fault, Firing
from slurm_gpu_exporter.report.remediate.memory import ActedOn
from slurm_gpu_exporter.report.remediate.remediator import Outcome, Remediator
from slurm_gpu_exporter.report.remediate.webhook import make_app, outcomes_of
from slurm_gpu_exporter.report.slurm.actions import SlurmNode

NOW = 1796119200.0  # 2026-12-01T10:00:00Z
LOG = "slurm_gpu_exporter.report.remediate.remediator"
RULE = {"alertname": "SlurmGpuLost", "instance": "gpu07:9817", "gpu": "3", "uuid": "GPU-x",
        "xid": "79"}
OLD = Episode.of(RULE, NOW - 120)
NEW = Episode.of(RULE | {"gpu": "4", "uuid": "GPU-y"}, NOW - 60)


def alert(status: str = "firing", **labels: str) -> dict[str, Any]:
    return {"status": status, "labels": {"alertname": "SlurmGpuLost",
                                         "instance": "gpu07:9817", **labels}}


class Slurm:
    def __init__(self, state: str = "IDLE", fail: bool = False) -> None:
        self.state, self.fail = state, fail
        self.drains: list[tuple[str, str]] = []
        self.lookups: list[str] = []

    def lookup(self, node: str) -> SlurmNode | None:
        self.lookups.append(node)
        return SlurmNode(node, self.state) if node.startswith("gpu") else None

    def drain(self, node: str, reason: str) -> None:
        if self.fail:
            raise ReportError("scontrol: Invalid node name")
        self.drains.append((node, reason))


def _rem(slurm: Slurm, **kwargs: Any) -> Remediator:
    return Remediator(drain=slurm.drain, lookup=slurm.lookup, clock=lambda: NOW,
                      acted_on=ActedOn(None), **kwargs)


def _texts(outcomes: list[Outcome]) -> list[tuple[str, str, str]]:
    return [(o.outcome, o.reason, o.text) for o in outcomes]


FIRING: Firing = {("SlurmGpuLost", "gpu07:9817"): [NEW, OLD]}
REASON = ("slurm-gpu-exporter SlurmGpuLost gpu 4 GPU-y xid 79 since 2026-12-01T09:59:00Z")


def test_two_alerts_of_a_node_drain_it_once_for_its_newest_episode(
        caplog: pytest.LogCaptureFixture) -> None:
    slurm, opened = Slurm(), []
    rem = _rem(slurm, opening=lambda fault, now: opened.append((fault, now)))
    with caplog.at_level(logging.INFO, LOG):
        out = rem.decide([alert(), alert()], FIRING)
    assert _texts(out) == [
        ("drained", "drained", "drained gpu07"),
        ("ignored", "same_drain", "ignored: gpu07 drained for another alert of this post")]
    assert slurm.drains == [("gpu07", REASON)] and slurm.lookups == ["gpu07"]
    fault = Fault("gpu07", ((OLD, "SlurmGpuLost"), (NEW, "SlurmGpuLost")))
    assert out[0].fault == fault and out[1].fault is None
    assert opened == [(fault, NOW)] and OLD in rem.acted_on and NEW in rem.acted_on
    assert rem.budget.used(NOW) == 1
    assert [r.getMessage() for r in caplog.records] == [f"drained gpu07: {REASON}"]


def test_an_alert_without_xid_uuid_or_gpu_gets_placeholders_in_the_reason() -> None:
    slurm = Slurm()
    bare = Episode.of({"alertname": "SlurmGpuLost", "instance": "gpu07:9817"}, NOW)
    _rem(slurm).decide([alert()], {("SlurmGpuLost", "gpu07:9817"): [bare]})
    assert slurm.drains == [("gpu07", "slurm-gpu-exporter SlurmGpuLost gpu _  xid - since "
                                      "2026-12-01T10:00:00Z")]


def test_a_repeat_of_the_firing_is_ignored_and_handed_on_as_a_repeat(
        caplog: pytest.LogCaptureFixture) -> None:
    slurm = Slurm()
    rem = _rem(slurm)
    rem.decide([alert()], FIRING)
    caplog.clear()  # the drain's own line, where an earlier test left INFO on
    with caplog.at_level(logging.INFO, LOG):
        out = rem.decide([alert(), alert()], FIRING)
    since = ("SlurmGpuLost since 2026-12-01T09:58:00Z, SlurmGpuLost since "
             "2026-12-01T09:59:00Z")
    assert _texts(out) == [("ignored", "same_episode", "ignored: acted on this firing of the "
                            f"alert before ({since})")] * 2
    assert out[0].fault == Fault("gpu07", ((OLD, "SlurmGpuLost"), (NEW, "SlurmGpuLost")),
                                 repeat=True)
    assert out[1].fault is None and len(slurm.drains) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"ignored 2 alert(s) for gpu07: acted on this firing before ({since}); a new firing "
        "drains again"]


def test_a_node_drained_already_keeps_its_reason_and_its_jobs_are_handed_on() -> None:
    slurm = Slurm("MIXED+drain")
    rem = _rem(slurm)
    out = rem.decide([alert(), alert()], FIRING)
    assert _texts(out) == [("ignored", "already_drained",
                            "ignored: gpu07 is already MIXED+drain")] * 2
    assert out[0].fault is not None and out[1].fault is None
    assert slurm.drains == [] and OLD in rem.acted_on and rem.budget.used(NOW) == 0


def test_a_node_slurm_does_not_list_is_refused_and_logged(caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    slurm = Slurm()
    firing: Firing = {("SlurmGpuLost", "node7:9817"): [OLD]}
    with caplog.at_level(logging.WARNING, LOG):
        out = _rem(slurm).decide([alert(instance="node7:9817")] * 2, firing)
    assert _texts(out) == [("refused", "unknown_node",
                            "refused: Slurm lists no node named node7")] * 2
    assert [r.getMessage() for r in caplog.records] == [
        "refused SlurmGpuLost (node node7): Slurm lists no node named node7"]


def test_past_the_budget_a_drain_is_refused_in_words() -> None:
    slurm = Slurm()
    rem = _rem(slurm, budget=DrainBudget(max_drains=1, window_s=1800.0))
    rem.budget.spend(NOW - 10)
    (out,) = rem.decide([alert()], FIRING)
    assert _texts([out]) == [("refused", "drain_cap", "refused: 1 drains in the last 1800 s "
                              "already (--max-drains); drain gpu07 by hand if it needs it")]
    assert OLD not in rem.acted_on


def test_a_dry_run_spends_the_budget_and_drains_nothing(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    slurm = Slurm()
    rem = _rem(slurm, dry_run=True)
    with caplog.at_level(logging.INFO, LOG):
        out = rem.decide([alert(), alert()], FIRING)
    assert _texts(out) == [
        ("dry_run", "dry_run", "dry run: would drain gpu07"),
        ("ignored", "same_drain", "ignored: gpu07 drained for another alert of this post")]
    assert out[0].fault is not None and slurm.drains == []
    assert rem.budget.used(NOW) == 1 and NEW in rem.acted_on
    assert [r.getMessage() for r in caplog.records] == [f"dry run: would drain gpu07: {REASON}"]


def test_a_drain_slurm_refuses_fails_each_alert_and_is_logged(caplog: pytest.LogCaptureFixture
                                                              ) -> None:
    rem = _rem(Slurm(fail=True))
    with caplog.at_level(logging.ERROR, LOG):
        out = rem.decide([alert(), alert()], FIRING)
    assert _texts(out) == [("failed", "slurm", "failed: scontrol: Invalid node name")] * 2
    assert rem.budget.used(NOW) == 0 and OLD not in rem.acted_on
    assert [r.getMessage() for r in caplog.records] == [
        "cannot drain gpu07: scontrol: Invalid node name"]


@pytest.mark.parametrize(("one", "expected"), [
    ({"status": "firing"}, ("ignored", "no_labels", "ignored: no labels")),
    ({"status": "firing", "labels": "x"}, ("ignored", "no_labels", "ignored: no labels")),
    (alert("resolved"), ("ignored", "not_firing",
                         "ignored: not firing (remediate never resumes a node)")),
    ({"labels": alert()["labels"]}, ("ignored", "not_firing",
                                     "ignored: not firing (remediate never resumes a node)")),
    (alert(alertname="Other"), ("ignored", "not_allowed",
                                "ignored: alert not in the allow-list")),
    ({"status": "firing", "labels": {"instance": "gpu07"}},
     ("ignored", "not_allowed", "ignored: alert not in the allow-list")),
    (alert(instance="ALL"), ("refused", "not_a_node", "refused: not a node name")),
    ({"status": "firing", "labels": {"alertname": "SlurmGpuLost"}},
     ("refused", "not_a_node", "refused: not a node name")),
])
def test_alerts_that_need_no_one_asked(one: dict[str, Any],
                                       expected: tuple[str, str, str]) -> None:
    rem = _rem(Slurm())
    assert rem.screen(one) is not None
    assert _texts([rem.handle(one, None)]) == [expected]
    assert not rem.needs_prometheus([one])


def test_a_refused_alert_is_logged_with_its_name_and_node_label(
        caplog: pytest.LogCaptureFixture) -> None:
    rem = _rem(Slurm(), node_label="host")
    with caplog.at_level(logging.WARNING, LOG):
        out = rem.handle(alert(host="gpu07"), {})
        rem.handle({"status": "firing", "labels": {"alertname": "SlurmGpuLost"}}, {})
    assert out.text == "refused: Prometheus shows no firing SlurmGpuLost for host=gpu07"
    assert [r.getMessage() for r in caplog.records] == [
        "refused SlurmGpuLost (host=gpu07): Prometheus shows no firing SlurmGpuLost for "
        "host=gpu07",
        "refused SlurmGpuLost (host=): not a node name"]


def test_the_node_its_agent_names_is_the_one_drained_and_checked() -> None:
    slurm = Slurm()
    named = Episode.of(RULE | {"slurm_node": "gpu17"}, NOW)
    out = _rem(slurm).handle(alert(), {("SlurmGpuLost", "gpu07:9817"): [OLD, named]})
    assert out.text == "drained gpu17" and slurm.drains[0][0] == "gpu17"
    hostile = Episode.of(RULE | {"slurm_node": "ALL"}, NOW)
    refused = _rem(slurm).handle(alert(), {("SlurmGpuLost", "gpu07:9817"): [hostile]})
    assert _texts([refused]) == [("refused", "not_a_node", "refused: ALL is not a node name")]
    # With a site's node label the agent's word is not asked for.
    site = _rem(Slurm(), node_label="host").handle(
        alert(host="gpu07"), {("SlurmGpuLost", "gpu07"): [named]})
    assert site.text == "drained gpu07"


def test_alerts_past_the_cap_of_a_post_are_refused_in_words(caplog: pytest.LogCaptureFixture
                                                            ) -> None:
    rem = _rem(Slurm(), max_alerts=2)
    with caplog.at_level(logging.WARNING, LOG):
        out = rem.decide([alert("resolved")] * 3, {})
    assert _texts(out)[2] == ("refused", "post_cap", "refused: more than 2 alerts in one post")
    assert len(out) == 3
    assert [r.getMessage() for r in caplog.records] == [
        "refused 1 alerts past the first 2 of one post (--max-alerts-per-post): Alertmanager "
        "groups alerts by node, a post this big is a flood or forged"]
    assert not rem.needs_prometheus([alert("resolved")] * 2 + [alert()])
    assert rem.needs_prometheus([alert("resolved"), alert()])


# -- the webhook ---------------------------------------------------------------------

def _serve(rem: Remediator, confirm: Any, body: Any = None, raw: bytes | None = None,
           ) -> tuple[int, str, dict[str, str], str]:
    async def go() -> tuple[int, str, dict[str, str], str]:
        async with TestClient(TestServer(make_app(rem, confirm))) as client:
            if raw is not None:
                resp = await client.post("/alerts", data=raw)
            else:
                resp = await client.post("/alerts", json=body)
            text = await resp.text()
            metrics = await client.get("/metrics")
            healthy = await (await client.get("/-/ready")).text()
            return resp.status, text, dict(metrics.headers), healthy
    return asyncio.run(go())


async def _firing() -> Firing:
    return FIRING


@pytest.mark.parametrize(("body", "raw", "answer"), [
    (None, b"{not json", "the body is not JSON: post Alertmanager's webhook payload\n"),
    (None, b"\xff\xfe", "the body is not JSON: post Alertmanager's webhook payload\n"),
    ([1], None, "no alerts list: post Alertmanager's webhook payload\n"),
    ({"alerts": {}}, None, "no alerts list: post Alertmanager's webhook payload\n"),
    ({"alerts": [alert(), 1]}, None, "no alerts list: post Alertmanager's webhook payload\n"),
])
def test_a_post_that_is_no_webhook_payload_is_400(body: Any, raw: bytes | None,
                                                  answer: str) -> None:
    slurm = Slurm()
    status, text, headers, healthy = _serve(_rem(slurm), _firing, body, raw)
    assert (status, text) == (400, answer) and slurm.drains == []
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    assert healthy == "Healthy\n"


def test_prometheus_is_asked_only_when_an_alert_needs_it() -> None:
    asked: list[int] = []

    async def confirm() -> Firing:
        asked.append(1)
        return FIRING

    rem = _rem(Slurm())
    out = asyncio.run(outcomes_of(rem, [alert("resolved")], confirm))
    assert asked == [] and out[0].reason == "not_firing"
    out = asyncio.run(outcomes_of(rem, [alert()], confirm))
    assert asked == [1] and out[0].text == "drained gpu07"
