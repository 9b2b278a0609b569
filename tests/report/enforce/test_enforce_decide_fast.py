"""enforce's decisions in words, one per branch: every skip's reason, the warnings' numbers
and cancel times at their edges, when a cancel waits for the last warning's gap, the cap's
order, het jobs cancelled whole, and the decisions as a table and as JSON. Jobs are given
as the idle windows the metrics showed (JobIdleness), Slurm's view as SlurmJob values."""

from __future__ import annotations

import json

import pytest

from slurm_gpu_exporter.model.slurm_id import SlurmJobId
from slurm_gpu_exporter.report.enforce.decisions import Decision, decide
from slurm_gpu_exporter.report.enforce.decisions_text import (
    decision_record,
    decisions_json,
    decisions_table,
)
from slurm_gpu_exporter.report.enforce.idle_window import JobIdleness, WindowUsage
from slurm_gpu_exporter.report.enforce.policy import Policy, parse_policy
from slurm_gpu_exporter.report.slurm.squeue import SlurmJob

NOW = 1_800_000_000.0  # 2027-01-15 08:00 UTC
H = 3600.0
POLICY = parse_policy('[exempt]\nusers = ["root"]\naccounts = ["vip"]\nqos = ["long"]\n')


def _job(jobid: str, idle_windows: int = 0, age: float = 5 * H, user: str = "ann",
         gpus: int = 1, fresh: int | None = None, doubt: str | None = None,
         doubts: tuple[str, ...] = (), policy: Policy = POLICY,
         nodes: tuple[str, ...] = ("gpu01",)) -> JobIdleness:
    """A job idle over its ``idle_windows`` shortest windows (``doubt`` on the next)."""
    windows = [WindowUsage(s, i < idle_windows, doubt if i == idle_windows else None)
               for i, s in enumerate(policy.windows_s)]
    keys = [(f"{n}:9817", str(g)) for n in nodes for g in range(gpus)]
    return JobIdleness(jobid, user, NOW - age, keys, windows, list(doubts),
                       {f"{n}:9817": n for n in nodes},
                       keys if fresh is None else keys[:fresh])


def _slurm(jobid: str, state: str = "RUNNING", user: str = "ann", account: str = "lab",
           qos: str = "normal", nodes: tuple[str, ...] | None = ("gpu01",),
           gpus: int | None = 1, ident: SlurmJobId | None = None) -> SlurmJob:
    return SlurmJob(jobid, user, account, "gpu", qos, "train", state, nodes, gpus,
                    ident=ident if ident is not None else SlurmJobId(jobid))


def _one(job: JobIdleness, slurm: SlurmJob | None, sent: list[float] | None = None,
         policy: Policy = POLICY) -> Decision:
    (decision,) = decide([job], {slurm.jobid: slurm} if slurm else {},
                         {job.jobid: sent} if sent is not None else {}, policy, NOW)
    return decision


@pytest.mark.parametrize(("job", "slurm", "reason", "doubtful"), [
    (_job("1"), None, "Slurm does not list the job, yet its series are fresh", True),
    (_job("1", fresh=0), None, "not running in Slurm (ended, or not a job of this cluster)",
     False),
    (_job("1"), _slurm("1", "COMPLETED"),
     "not running in Slurm (ended, or not a job of this cluster)", False),
    (_job("1"), _slurm("1", "SUSPENDED"), "Slurm lists it as SUSPENDED, not RUNNING", True),
    (_job("1"), _slurm("1", ident=SlurmJobId("1", "1")),
     "Slurm's answer does not say which array task or het job component it is, so no id "
     "names it alone", True),
    (_job("1"), _slurm("1", user="bob"), "Slurm says the job is bob's, the metrics ann's",
     True),
    (_job("1", user="root"), _slurm("1", user="root"), "exempt (user root)", False),
    (_job("1"), _slurm("1", account="vip"), "exempt (account vip)", False),
    (_job("1"), _slurm("1", qos="long"), "exempt (qos long)", False),
    (_job("1"), _slurm("1", nodes=None, gpus=None),
     "Slurm's answer does not say which nodes the job runs on; Slurm's answer does not say "
     "how many GPUs the job holds", True),
    (_job("1", gpus=2, fresh=1), _slurm("1", nodes=("gpu01", "gpu03", "gpu02"), gpus=3),
     "Slurm runs it on gpu02, gpu03 too, with no fresh series of it from there (agent or "
     "scrape target missing?); Slurm allocated 3 GPU(s), fresh series show 1", True),
    (_job("1", doubts=("the agent target gpu01:9817 is down",)), _slurm("1"),
     "the agent target gpu01:9817 is down", True),
    (_job("1", age=30 * 60 - 1), _slurm("1"), "younger than min_job_age (30m)", False),
])
def test_each_skip_says_why(job: JobIdleness, slurm: SlurmJob | None, reason: str,
                            doubtful: bool) -> None:
    decision = _one(job, slurm)
    assert (decision.action, decision.reason, decision.doubtful) == ("skip", reason, doubtful)
    assert decision.account == (slurm.account if slurm else "")
    assert decision.name == ("train" if slurm else "")
    assert decision.partition == ("gpu" if slurm else "")


def test_a_job_exactly_min_job_age_old_is_judged() -> None:
    decision = _one(_job("1", age=30 * 60), _slurm("1"))
    assert (decision.action, decision.reason) == ("none", "used its GPUs in the last 1h")


def test_a_doubt_in_a_window_keeps_what_was_idle_before_it() -> None:
    decision = _one(_job("1", idle_windows=1, doubt="NVML was down"), _slurm("1"))
    assert (decision.action, decision.reason, decision.idle_for_s, decision.doubtful) == (
        "skip", "NVML was down", H, True)


@pytest.mark.parametrize(("idle", "sent", "action", "reason", "warning", "cancel_at"), [
    (0, [], "none", "used its GPUs in the last 1h", None, None),
    (1, [], "warn", "idle for 1h: warning 1 of 2", 1, NOW + H),
    (3, [], "warn", "idle for 2h: warning 1 of 2", 1, NOW),  # a late first run
    (2, [NOW - 1800], "warn", "idle for 1h30m: warning 2 of 2", 2, NOW + 1800),
    (3, [NOW - 3600], "warn", "idle for 2h: warning 2 of 2", 2, NOW + 1800),
    (2, [NOW - 1800, NOW - 60], "none", "idle for 1h30m; warning 2 sent, cancel at 2h idle",
     None, None),
    (3, [NOW - 3600, NOW - 1000], "none", "idle for 2h; the last warning was 16m ago, cancel "
                                          "after 30m", None, None),
    (3, [NOW - 3600, NOW - 1800], "cancel", "idle for 2h (busy under 1%) after 2 warning(s)",
     None, None),
])
def test_warnings_then_the_cancel_at_their_edges(idle: int, sent: list[float], action: str,
                                                 reason: str, warning: int | None,
                                                 cancel_at: float | None) -> None:
    decision = _one(_job("1", idle_windows=idle), _slurm("1"), sent)
    assert (decision.action, decision.reason, decision.warning, decision.cancel_at) == (
        action, reason, warning, cancel_at)
    assert decision.idle_for_s == (POLICY.windows_s[idle - 1] if idle else 0.0)
    assert decision.components == ((_slurm("1"),) if action == "cancel" else ())


def test_a_job_that_used_its_gpus_again_forgets_its_warnings() -> None:
    assert _one(_job("1"), _slurm("1"), [NOW - H]).forget_warnings
    assert not _one(_job("1"), _slurm("1"), []).forget_warnings


THREE = parse_policy('[idle]\nwarn_after = ["60m", "90m", "100m"]\n')


@pytest.mark.parametrize(("sent", "action", "reason"), [
    ([NOW - 9000, NOW - 8000, NOW - 1000], "none",
     "idle for 2h; the last warning was 16m ago, cancel after 20m"),
    ([NOW - 9000, NOW - 8000, NOW - 1200], "cancel",
     "idle for 2h (busy under 1%) after 3 warning(s)"),
])
def test_the_last_warnings_gap_is_counted_from_the_last_warning(
        sent: list[float], action: str, reason: str) -> None:
    decision = _one(_job("1", idle_windows=4, policy=THREE), _slurm("1"), sent, THREE)
    assert (decision.action, decision.reason) == (action, reason)


def test_without_warnings_a_job_idle_past_the_cancel_is_cancelled_at_once() -> None:
    none = parse_policy('[idle]\nwarn_after = []\n')
    assert _one(_job("1", idle_windows=0, policy=none), _slurm("1"), [], none).reason == (
        "used its GPUs in the last 2h")
    decision = _one(_job("1", idle_windows=1, policy=none), _slurm("1"), [NOW], none)
    assert (decision.action, decision.reason) == (
        "cancel", "idle for 2h (busy under 1%) after 1 warning(s)")


def test_the_cap_defers_the_jobs_idle_the_shortest() -> None:
    capped = parse_policy('[idle]\nmax_cancels_per_run = 1\nwarn_after = []\n'
                          'cancel_after = "60m"\n')
    jobs = [_job(j, policy=capped) for j in ("7", "10", "9")]
    for job in jobs:
        job.windows = [WindowUsage(3600.0, True, None), WindowUsage(5400.0, job.jobid == "10",
                                                                    None)]
    decisions = decide(jobs, {j.jobid: _slurm(j.jobid) for j in jobs}, {}, capped, NOW)
    assert [(d.jobid, d.action, d.idle_for_s) for d in decisions] == [
        ("7", "skip", 3600.0), ("10", "cancel", 5400.0), ("9", "skip", 3600.0)]
    assert decisions[0].reason == ("idle for 1h (busy under 1%) after 0 warning(s); deferred: "
                                   "max_cancels_per_run (1) reached")


def _het(offset: int) -> SlurmJob:
    jobid = str(40 + offset)
    return _slurm(jobid, ident=SlurmJobId(jobid, het_job_id="40", het_job_offset=str(offset)))


def test_a_het_job_is_cancelled_whole_under_its_leader() -> None:
    jobs = [_job("40", idle_windows=3), _job("41", idle_windows=3)]
    sent = {"40": [NOW - 3600, NOW - 1800], "41": [NOW - 3600, NOW - 1800]}
    decisions = decide(jobs, {"40": _het(0), "41": _het(1)}, sent, POLICY, NOW)
    assert [(d.jobid, d.action, d.reason) for d in decisions] == [
        ("40", "cancel", "idle for 2h (busy under 1%) after 2 warning(s); het job 40: all 2 "
                         "components idle"),
        ("41", "skip", "goes with the cancel of its het job 40 (under 40+0)")]
    assert decisions[0].components == (_het(0), _het(1)) and decisions[1].components == ()


def test_a_het_job_with_a_part_not_due_or_not_seen_is_left_whole() -> None:
    sent = {"40": [NOW - 3600, NOW - 1800], "41": [NOW - 3600, NOW - 1800]}
    busy = decide([_job("40", idle_windows=3), _job("41")], {"40": _het(0), "41": _het(1)},
                  sent, POLICY, NOW)
    assert [(d.action, d.doubtful, d.components) for d in busy] == [
        ("skip", True, ()), ("none", False, ())]
    assert busy[0].reason == (
        "idle for 2h (busy under 1%) after 2 warning(s); but het job 40 is cancelled only "
        "whole, when every component is idle, and 40+1 is not due (none: used its GPUs in "
        "the last 1h)")
    unseen = decide([_job("41", idle_windows=3)], {"40": _het(0), "41": _het(1)}, sent,
                    POLICY, NOW)
    assert unseen[0].reason.endswith("and 40+0 has no GPU series to judge")


# -- as a table and as JSON ---------------------------------------------------------------

DECISIONS = [
    Decision("42", "ann", "lab", "gpu", "train\x1b[2J", 2, ("gpu01", "gpu02"), 5400.0, "warn",
             "idle for 1h30m: warning 2 of 2", warning=2, cancel_at=NOW + 1800),
    Decision("7", "bob", "lab", "gpu", "x", 1, ("gpu03",), None, "skip",
             "not running in Slurm", doubtful=True)]


def test_the_table_shows_each_decision_with_user_text_escaped() -> None:
    assert decisions_table(DECISIONS, True, width=100).splitlines() == [
        "Dry run: what enforce --cancel would do".ljust(100), " " * 100,
        "  Job   User   Name           GPUs   Nodes         Idle for   Action   Reason"
        .ljust(100),
        " " + "─" * 98 + " ",
        "  42    ann    train\\x1b[2J      2   gpu01,gpu02   1h30m      warn 2   idle for "
        "1h30m: warning 2".ljust(100),
        " " * 71 + "of 2".ljust(29),
        "  7     bob    x                 1   gpu03         -          skip     not running in "
        "Slurm".ljust(100),
        " " * 100]
    assert decisions_table(DECISIONS, False, width=100).startswith("What enforce did   ")


def test_the_table_is_as_wide_as_asked_and_says_when_it_is_empty() -> None:
    long = [Decision("1", "u", "a", "p", "n", 1, ("g",), 60.0, "none", "x " * 150)]
    assert max(len(line) for line in decisions_table(long, False).splitlines()) == 140
    empty = decisions_table([], False, width=60)
    assert empty.endswith("\nNo running job holds GPUs in the metrics.\n")
    assert "No running job" not in decisions_table(DECISIONS, False)


def test_a_decision_as_json_values() -> None:
    assert decision_record(DECISIONS[0]) == {
        "jobid": "42", "job": "42", "target": "42", "user": "ann", "account": "lab",
        "partition": "gpu", "name": "train\x1b[2J", "gpus": 2, "nodes": ["gpu01", "gpu02"],
        "idle_for_seconds": 5400.0, "action": "warn", "warning": 2,
        "cancel_at": "2027-01-15 08:30 UTC", "doubtful": False,
        "reason": "idle for 1h30m: warning 2 of 2"}
    assert decision_record(DECISIONS[1])["cancel_at"] is None
    assert decision_record(DECISIONS[1])["doubtful"] is True


def test_the_decisions_as_json_text() -> None:
    text = decisions_json(DECISIONS[1:], dry_run=True, queries=14)
    assert json.loads(text) == {"dry_run": True, "queries": 14,
                                "decisions": [decision_record(DECISIONS[1])]}
    assert text.startswith('{\n "dry_run": true,\n "queries": 14,\n "decisions": [\n  {\n')
    assert text.endswith("}\n")
