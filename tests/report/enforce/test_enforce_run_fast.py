"""enforce's run in this process, in words: what one run decides and acts on over a
stand-in Prometheus (fixed answers by query) and stand-ins for Slurm's commands and the
notify channel, each action's log line, each failure's exit code, the messages a user
gets and the AdminComment a cancel leaves."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_exporter.model.slurm_id import SlurmJobId
from slurm_gpu_exporter.report.enforce import run
from slurm_gpu_exporter.report.enforce.decisions import Decision
from slurm_gpu_exporter.report.enforce.idle_window import fetch_idleness, idle_queries
from slurm_gpu_exporter.report.enforce.policy import parse_policy
from slurm_gpu_exporter.report.enforce.run import (
    EnforceOptions,
    act_all,
    act_on,
    cancel_reason,
    message_facts,
    run_enforce,
)
from slurm_gpu_exporter.report.enforce.state import EnforceState
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.notify.send import Message
from slurm_gpu_exporter.report.prometheus.client import Sample
from slurm_gpu_exporter.report.prometheus.queries import Filters
from slurm_gpu_exporter.report.slurm.squeue import SlurmJob
from tests.report.enforce.test_decisions import WINDOWS, FakeJob, answers, slurm_of

NOW = 1_800_000_000.0  # 2027-01-15 08:00 UTC
H = 3600.0
LOG = "slurm_gpu_exporter.report.enforce.run"
POLICY = parse_policy('[messages]\nwarning_subject = "W {jobid} {warning}/{warnings}"\n'
                      'warning = "idle {idle_for} on {nodes}, cancel at {cancel_at}"\n'
                      'cancel_subject = "C {jobid}"\ncancel = "{name} {account} {partition} '
                      '{gpus} {cancel_after} {busy_fraction}"\n')
LISTED = SlurmJob("42", "ann", "lab", "gpu", "normal", "train", "RUNNING", ("gpu01",), 1,
                  NOW - 5 * H, SlurmJobId("42"))


def _decision(action: str, **kw: Any) -> Decision:
    base: dict[str, Any] = {"jobid": "42", "user": "ann", "account": "lab", "partition": "gpu",
                            "name": "train", "gpus": 1, "nodes": ("gpu01", "gpu02"),
                            "idle_for_s": 2 * H, "action": action, "reason": "idle for 2h",
                            "slurm": LISTED, "components": (LISTED,)}
    return Decision(**(base | kw))


class Channel:
    """The notify channel and Slurm's commands, recording what they were given."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: list[tuple[Message, str, str, Any]] = []
        self.calls: list[tuple[str, ...]] = []
        self.fail: set[str] = set()
        monkeypatch.setattr(run, "send", self._send)
        monkeypatch.setattr(run, "still_as_listed", self._recheck)
        monkeypatch.setattr(run, "record_reason", self._record)
        monkeypatch.setattr(run, "cancel_job", self._cancel)

    def _recheck(self, jobs: tuple[SlurmJob, ...]) -> bool:
        if "squeue" in self.fail:
            raise ReportError("squeue: slurmctld down", 8)
        return "recheck" not in self.fail

    def _send(self, message: Message, target: str, sender: str, login: Any) -> None:
        if "send" in self.fail:
            raise ReportError("relay refused", 4)
        self.sent.append((message, target, sender, login))

    def _record(self, ident: SlurmJobId, why: str) -> None:
        self.calls.append(("record", ident.display, why))

    def _cancel(self, ident: SlurmJobId) -> None:
        if "cancel" in self.fail:
            raise ReportError("scancel: Invalid job id", 8)
        self.calls.append(("cancel", ident.display))


def _options(tmp_path: Path, notify: str | None = "smtp://relay", cancel: bool = True,
             policy: Any = POLICY) -> EnforceOptions:
    return EnforceOptions(policy, cancel=cancel, state_path=tmp_path / "enforce.json",
                          filters=Filters(), notify=notify, mail_to="{user}@example.org",
                          mail_from="gpu-police")


def test_the_facts_a_message_may_name() -> None:
    decision = _decision("warn", warning=1, cancel_at=NOW + H, name="", idle_for_s=None)
    assert message_facts(decision, POLICY) == {
        "jobid": "42", "name": "-", "user": "ann", "account": "lab", "partition": "gpu",
        "gpus": 1, "nodes": "gpu01, gpu02", "idle_for": "0m", "cancel_after": "2h",
        "cancel_at": "2027-01-15 09:00 UTC", "warning": 1, "warnings": 2,
        "busy_fraction": 0.01}
    assert message_facts(_decision("cancel"), POLICY)["warning"] == 0


def test_a_cancels_admin_comment_says_when_and_why() -> None:
    assert cancel_reason(_decision("cancel"), NOW) == (
        "slurm-gpu-report enforce: cancelled 2027-01-15 08:00 UTC, GPUs idle for 2h")


def test_a_warning_is_sent_remembered_and_logged(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    channel, state = Channel(monkeypatch), EnforceState(tmp_path / "enforce.json")
    decision = _decision("warn", warning=2, cancel_at=NOW + H)
    with caplog.at_level(logging.INFO, LOG):
        assert act_on(decision, state, _options(tmp_path), NOW) == 0
    ((message, target, sender, _),) = channel.sent
    assert (target, sender) == ("smtp://relay", "gpu-police")
    assert (message.to, message.subject, message.jobids) == ("ann@example.org",
                                                             "W 42 2/2", ("42",))
    assert message.text == "idle 2h on gpu01, gpu02, cancel at 2027-01-15 09:00 UTC\n"
    assert state.warnings() == {"42": [NOW]}
    assert json.loads((tmp_path / "enforce.json").read_text()) == {
        "jobs": {"42": {"warnings": [NOW]}}}
    assert [r.getMessage() for r in caplog.records] == [
        "warned job 42 (ann): warning 2 of 2, idle for 2h"]


def test_a_warning_that_cannot_be_sent_is_retried_next_run(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    channel, state = Channel(monkeypatch), EnforceState(tmp_path / "enforce.json")
    channel.fail.add("send")
    with caplog.at_level(logging.INFO, LOG):
        assert act_on(_decision("warn", warning=1), state, _options(tmp_path), NOW) == 6
    assert state.warnings() == {}
    assert [r.getMessage() for r in caplog.records] == [
        "job 42 (ann): warning 1 not sent, retried next run: relay refused"]


def test_a_job_that_used_its_gpus_again_has_its_warnings_forgotten(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    Channel(monkeypatch)
    state = EnforceState(tmp_path / "enforce.json")
    state.add_warning("42", NOW - H)
    with caplog.at_level(logging.INFO, LOG):
        assert act_on(_decision("none", forget_warnings=True), state, _options(tmp_path),
                      NOW) == 0
    assert state.jobs == {} and json.loads((tmp_path / "enforce.json").read_text()) == {
        "jobs": {}}
    assert [r.getMessage() for r in caplog.records] == [
        "job 42 (ann) used its GPUs again: its warnings are forgotten"]


def test_a_cancel_is_recorded_carried_out_told_and_logged(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    channel, state = Channel(monkeypatch), EnforceState(tmp_path / "enforce.json")
    with caplog.at_level(logging.INFO, LOG):
        assert act_on(_decision("cancel"), state, _options(tmp_path), NOW) == 0
    assert channel.calls == [
        ("record", "42", "slurm-gpu-report enforce: cancelled 2027-01-15 08:00 UTC, GPUs "
                         "idle for 2h"), ("cancel", "42")]
    ((message, target, sender, _),) = channel.sent
    assert (message.subject, message.text, target, sender) == (
        "C 42", "train lab gpu 1 2h 0.01\n", "smtp://relay", "gpu-police")
    assert state.jobs == {"42": {"cancelled": NOW}}
    assert [r.getMessage() for r in caplog.records] == ["cancelled job 42 (ann): idle for 2h"]


@pytest.mark.parametrize(("fail", "code", "line", "cancelled"), [
    ("recheck", 7, "job 42 (ann) not cancelled: Slurm no longer runs it as this run saw it "
                   "(ended, requeued or changed since); left for the next run", False),
    ("cancel", 8, "job 42 (ann) not cancelled: scancel: Invalid job id", False),
    ("send", 6, "job 42 (ann) was cancelled; telling the user failed: relay refused", True),
])
def test_each_failure_of_a_cancel_has_its_line_and_code(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        fail: str, code: int, line: str, cancelled: bool) -> None:
    channel, state = Channel(monkeypatch), EnforceState(tmp_path / "enforce.json")
    channel.fail.add(fail)
    with caplog.at_level(logging.WARNING, LOG):
        assert act_on(_decision("cancel"), state, _options(tmp_path), NOW) == code
    assert [r.getMessage() for r in caplog.records] == [line]
    assert ("42" in state.jobs) is cancelled


def test_a_cancel_without_a_channel_tells_nobody(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    channel, state = Channel(monkeypatch), EnforceState(tmp_path / "enforce.json")
    assert act_on(_decision("cancel"), state, _options(tmp_path, notify=None), NOW) == 0
    assert channel.sent == [] and channel.calls[-1] == ("cancel", "42")
    assert act_on(_decision("warn", warning=1), state, _options(tmp_path, notify=None),
                  NOW) == 0
    assert channel.sent == [] and state.warnings() == {"42": []}


def test_one_jobs_failure_is_its_line_and_the_others_go_on(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    channel, state = Channel(monkeypatch), EnforceState(tmp_path / "enforce.json")
    channel.fail.add("squeue")
    with caplog.at_level(logging.ERROR, LOG):
        other = replace(LISTED, jobid="43", ident=SlurmJobId("43"))
        assert act_all([_decision("cancel", jobid="43", slurm=other, components=(other,)),
                        _decision("warn", warning=1)], state,
                       _options(tmp_path), NOW) == {8}
    assert len(channel.sent) == 1 and state.warnings() == {"42": [NOW]}
    assert [r.getMessage() for r in caplog.records] == ["job 43: squeue: slurmctld down"]
    assert act_all([_decision("none")], state, _options(tmp_path), NOW) == set()


def test_a_state_file_that_cannot_be_written_stops_the_actions(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    Channel(monkeypatch)
    (tmp_path / "file").write_text("")
    state = EnforceState(tmp_path / "enforce.json")
    state.path = tmp_path / "file" / "enforce.json"  # its directory is a file now
    with pytest.raises(ReportError) as caught:
        act_all([_decision("warn", warning=1)], state, _options(tmp_path), NOW)
    assert caught.value.exit_code == 2


# -- a whole run ----------------------------------------------------------------------------

class Prometheus:
    """Fixed answers by query, and the count of queries."""

    def __init__(self, by_name: dict[str, list[Sample]], node_label: str | None = None) -> None:
        queries = idle_queries(WINDOWS, Filters(), node_label)
        self.by_query = {queries[name]: samples for name, samples in by_name.items()}
        self.queries = 0
        self.at: set[float] = set()

    async def instant(self, query: str, at: float) -> list[Sample]:
        self.queries += 1
        self.at.add(at)
        return self.by_query[query]


IDLE = FakeJob("42", age=4 * H)  # never busy: its cancel is due
WARN = FakeJob("43", age=4 * H, busy_in={WINDOWS[-1]: 600.0, WINDOWS[-2]: 600.0})


def _run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, jobs: list[FakeJob],
         slurm: dict[str, SlurmJob], **kw: Any) -> Any:
    monkeypatch.setattr(run, "listed_jobs", lambda: slurm)
    prom = Prometheus(answers(jobs))
    policy = parse_policy("")
    done = asyncio.run(run_enforce(prom, _options(tmp_path, policy=policy, **kw),  # type: ignore[arg-type]
                                   NOW))
    assert prom.at == {NOW}
    return done


def test_a_run_decides_acts_and_forgets_jobs_slurm_no_longer_runs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    channel = Channel(monkeypatch)
    state = EnforceState(tmp_path / "enforce.json")
    state.add_warning("42", NOW - 2 * H)
    state.add_warning("42", NOW - 1.5 * H)
    state.add_warning("77", NOW - H)  # Slurm no longer runs job 77
    done = _run(monkeypatch, tmp_path, [IDLE, WARN], slurm_of(IDLE, WARN))
    assert [(d.jobid, d.action) for d in done.decisions] == [("42", "cancel"), ("43", "warn")]
    assert (done.queries, done.exit_code) == (3 * len(WINDOWS) + 5, 0)
    assert channel.calls[-1] == ("cancel", "42") and len(channel.sent) == 2
    assert set(EnforceState(tmp_path / "enforce.json").jobs) == {"42", "43"}


def test_a_dry_run_acts_on_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    channel = Channel(monkeypatch)
    done = _run(monkeypatch, tmp_path, [IDLE], slurm_of(IDLE), cancel=False, notify=None)
    assert [d.action for d in done.decisions] == ["warn"] and done.exit_code == 0
    assert channel.calls == [] and not (tmp_path / "enforce.json").exists()


def test_a_warning_with_no_channel_stops_the_run_before_acting(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    channel = Channel(monkeypatch)
    with pytest.raises(ReportError) as caught:
        _run(monkeypatch, tmp_path, [IDLE], slurm_of(IDLE), notify=None)
    assert str(caught.value) == ("enforce --cancel has a warning to send and no --notify "
                                 "channel: give --notify smtp://… or a webhook URL")
    assert channel.calls == []


@pytest.mark.parametrize(("fail", "code"), [("cancel", 8), ("send", 6), ("recheck", 7)])
def test_the_runs_exit_code_names_the_worst_failure(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fail: str, code: int) -> None:
    channel = Channel(monkeypatch)
    channel.fail.add(fail)
    state = EnforceState(tmp_path / "enforce.json")
    state.add_warning("42", NOW - 2 * H)
    state.add_warning("42", NOW - 1.5 * H)
    doubtful = FakeJob("44", age=4 * H)
    listed = slurm_of(IDLE, doubtful)
    listed["44"] = SlurmJob("44", "ann", "lab", "gpu", "normal", "t", "RUNNING", ("gpu01",),
                            None, ident=SlurmJobId("44"))  # no GPU count: doubtful
    done = _run(monkeypatch, tmp_path, [IDLE, doubtful], listed)
    assert done.exit_code == code
    assert done.decisions[1].doubtful


def test_agents_that_name_no_node_are_said_once(caplog: pytest.LogCaptureFixture) -> None:
    jobs = [FakeJob(str(i), age=4 * H, instance=f"gpu0{i}:9817") for i in range(1, 6)]
    prom = Prometheus(answers(jobs))
    with caplog.at_level(logging.WARNING, "slurm_gpu_exporter.report.enforce.idle_window"):
        found = asyncio.run(fetch_idleness(prom, WINDOWS, Filters(), 0.01, NOW))  # type: ignore[arg-type]
    assert [j.jobid for j in found] == ["1", "2", "3", "4", "5"]
    assert [r.getMessage() for r in caplog.records] == [
        "the agents at gpu01:9817, gpu02:9817, gpu03:9817 and 2 more name no one Slurm node "
        "in slurm_gpu_exporter_node_info (older agents, or two nodes for a target): their "
        "GPUs' node is taken to be the target's host; upgrade them, or label the targets "
        "and pass --node-label"]
    caplog.clear()
    labelled = Prometheus(answers(jobs[:1]), node_label="host")
    with caplog.at_level(logging.WARNING, "slurm_gpu_exporter.report.enforce.idle_window"):
        asyncio.run(fetch_idleness(labelled, WINDOWS, Filters(), 0.01, NOW, "host"))  # type: ignore[arg-type]
    assert caplog.records == []
