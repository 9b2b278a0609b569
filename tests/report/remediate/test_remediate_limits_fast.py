"""remediate's texts at their length limits (a log line, an answer or Slurm's comment cut
where the code says, whatever alert names, UUIDs or node lists a site has), the jobs after
a het job's second part, and the requeue time written in UTC whatever the host's zone."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from slurm_gpu_exporter.model.slurm_id import SlurmJobId
from slurm_gpu_exporter.report.prometheus.client import Sample
from slurm_gpu_exporter.report.remediate.confirm import Episode, Fault, Firing
from slurm_gpu_exporter.report.remediate.pending import PendingRequeue
from slurm_gpu_exporter.report.remediate.requeue_policy import choose
from tests.report.remediate.test_remediator_fast import Slurm, _rem, alert
from tests.report.remediate.test_requeue_fast import (
    ALL,
    NOW,
    START,
    _now,
    _on,
    _requeuer,
    job,
)
from tests.report.remediate.test_requeue_fast import Slurm as Commands

REM_LOG = "slurm_gpu_exporter.report.remediate.remediator"
REQ_LOG = "slurm_gpu_exporter.report.remediate.requeuer"
A, B = "A" * 200, "B" * 200


def test_a_repeat_of_long_alert_names_is_cut_in_the_answer_and_the_log(
        caplog: pytest.LogCaptureFixture) -> None:
    episodes = [Episode.of({"alertname": n, "instance": "gpu07:9817"}, NOW) for n in (A, B)]
    firing: Firing = {(A, "gpu07:9817"): [episodes[0]], (B, "gpu07:9817"): [episodes[1]]}
    rem = _rem(Slurm(), allowed=frozenset({A, B}))
    posts = [alert(alertname=A), alert(alertname=B)]
    rem.decide(posts, firing)
    caplog.clear()
    with caplog.at_level(logging.INFO, REM_LOG):
        out = rem.decide(posts, firing)
    since = f"{A} since 2026-12-01T10:00:00Z, {B} since 2026-12-01T10:00:00Z"[:300]
    assert out[0].text == f"ignored: acted on this firing of the alert before ({since})"
    assert [r.getMessage() for r in caplog.records] == [
        f"ignored 2 alert(s) for gpu07: acted on this firing before ({since}); a new firing "
        "drains again"]


def test_a_refusal_of_a_long_node_name_is_cut_in_the_answer_and_the_log(
        caplog: pytest.LogCaptureFixture) -> None:
    node = "gpu" + "x" * 125  # the longest name a node may have
    episode = Episode.of({"alertname": "SlurmGpuLost", "host": node}, NOW)
    rem = _rem(Slurm(), node_label="host")
    rem.budget.max_drains = 0
    with caplog.at_level(logging.WARNING, REM_LOG):
        (out,) = rem.decide([alert(host=node)], {("SlurmGpuLost", node): [episode]})
    why = (f"0 drains in the last 3600 s already (--max-drains); drain {node} by hand if it "
           "needs it")
    assert len(why) > 200 and out.text == f"refused: {why}"
    long_why = "y" * 400
    assert rem._refused_node(rem_node(node), "x", long_why)[0].text == (
        f"refused: {'y' * 300}")
    assert caplog.records[-1].getMessage() == (
        f"refused SlurmGpuLost (node {node}): {'y' * 300}")


def rem_node(name: str) -> object:
    from slurm_gpu_exporter.report.remediate.remediator import _Node

    node = _Node(name, [0])
    node.episodes[Episode.of({"gpu": "0"}, NOW)] = "SlurmGpuLost"
    return node


def test_a_long_uuid_and_a_long_node_list_are_cut_in_the_log(
        caplog: pytest.LogCaptureFixture) -> None:
    episode = Episode.of({"alertname": "SlurmGpuLost", "instance": "gpu07:9817", "gpu": "1",
                          "uuid": "U" * 250}, NOW)
    fault = Fault("gpu07", ((episode, "SlurmGpuLost"),))
    with caplog.at_level(logging.INFO, REQ_LOG):
        _on(_requeuer(Commands({}), samples=[]), [fault])
    assert caplog.records[-1].getMessage() == (
        "no job holds the faulty GPU of gpu07 (" + f"gpu 1 {'U' * 250}"[:200]
        + ") in Prometheus: none signalled")
    caplog.clear()
    far = tuple(f"gpu{i:03d}" for i in range(60))
    held = [Sample({"jobid": "40", "gpu": "1", "uuid": "U" * 250}, NOW)]
    with caplog.at_level(logging.INFO, REQ_LOG):
        _on(_requeuer(Commands({"40": job("40", nodes=far[1:])}), samples=held), [fault])
    text = f"job 40: Slurm lists it RUNNING on {','.join(far[1:])}, not running on gpu07"
    assert caplog.records[-1].getMessage() == (
        f"not signalling for the GPU fault on gpu07: {text[:300]}")


@pytest.fixture
def tokyo() -> Iterator[None]:
    """The host's clock in another zone than UTC."""
    import os

    old = os.environ.get("TZ")
    os.environ["TZ"] = "Asia/Tokyo"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


def test_a_requeue_is_recorded_in_utc_and_cut_to_slurms_length(tokyo: None) -> None:
    slurm = Commands({"40": job("40")})
    due = PendingRequeue("k", "40", START, NOW, "gpu07", "x" * 450 + " requeue due")
    before = time.strftime("%H", time.gmtime())
    _now(_requeuer(slurm), due)
    after = time.strftime("%H", time.gmtime())
    assert [c[0] for c in slurm.calls] == ["requeue", "record"]
    assert slurm.calls[1][2] == "x" * 400
    short = PendingRequeue("k", "40", START, NOW, "gpu07", "fault: requeue due")
    _now(_requeuer(slurm2 := Commands({"40": job("40")})), short)
    recorded = slurm2.calls[1][2]
    assert recorded.startswith("fault: requeued at ") and recorded.endswith("Z")
    assert recorded[len("fault: requeued at "):][:2] in (before, after)


def test_after_a_het_jobs_second_part_the_next_jobs_are_still_looked_at() -> None:
    lead = job("40", ident=SlurmJobId("40", het_job_id="40", het_job_offset="0"))
    part = job("41", ident=SlurmJobId("41", het_job_id="40", het_job_offset="1"))
    listed = {"40": lead, "41": part, "100": job("100")}
    choices = choose(ALL, "gpu07", {"40", "41", "100"}, listed, set())
    assert [(c.jobid, c.act) for c in choices] == [("40", True), ("100", True)]
