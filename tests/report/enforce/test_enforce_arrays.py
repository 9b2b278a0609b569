"""enforce on array tasks and het jobs: each action names exactly one job as Slurm
resolves it, a het job is cancelled only whole, and the re-check before a cancel
compares who the job is. Fixed answers: no Prometheus, no Slurm."""

from __future__ import annotations

import json
from dataclasses import replace

from slurm_gpu_exporter.model.slurm_id import SlurmJobId
from slurm_gpu_exporter.report.enforce.decisions_text import decisions_json, decisions_table
from slurm_gpu_exporter.report.slurm.actions import same_as_listed
from slurm_gpu_exporter.report.slurm.squeue import SlurmJob, parse_squeue_json
from tests.report.enforce.test_decisions import NOW, FakeJob, H, run, slurm_of

DUE = [NOW - 2 * H, NOW - H]  # both warnings sent: an idle job is due for its cancel
IDLE_3H = {"age": 3 * H}
BUSY_3H = {"age": 3 * H, "busy_in": {w: w for w in (3600.0, 5400.0, 7200.0)}}


def listed(job: FakeJob, ident: SlurmJobId) -> dict[str, SlurmJob]:
    return {job.jobid: replace(slurm_of(job)[job.jobid], ident=ident)}


def test_idle_task_holding_the_arrays_id_is_cancelled_as_its_task_alone() -> None:
    """The issue's case: task 1 started last and kept the array's id 243; its sibling
    (244, task 0) is busy. The cancel names 243_1, never the bare 243 (every task)."""
    holder, sibling = FakeJob("243", **IDLE_3H), FakeJob("244", **BUSY_3H)
    slurm = {**listed(holder, SlurmJobId("243", "243", "1")),
             **listed(sibling, SlurmJobId("244", "243", "0"))}
    decisions = run([holder, sibling], sent={"243": DUE, "244": DUE}, slurm=slurm)
    assert decisions["243"].action == "cancel" and decisions["244"].action == "none"
    assert decisions["243"].target == "243_1" and decisions["243"].shown == "243_1"
    assert [j.jobid for j in decisions["243"].components] == ["243"]
    assert [j.ident.target for j in decisions["243"].components if j.ident] == ["243_1"]


def test_idle_sibling_is_cancelled_as_its_task_and_the_holder_is_left() -> None:
    holder, sibling = FakeJob("243", **BUSY_3H), FakeJob("244", **IDLE_3H)
    slurm = {**listed(holder, SlurmJobId("243", "243", "1")),
             **listed(sibling, SlurmJobId("244", "243", "0"))}
    decisions = run([holder, sibling], sent={"243": DUE, "244": DUE}, slurm=slurm)
    assert decisions["244"].action == "cancel" and decisions["244"].target == "243_0"
    assert decisions["243"].action == "none"


def test_het_job_with_one_idle_component_is_doubtful_and_not_cancelled() -> None:
    leader, other = FakeJob("300", **IDLE_3H), FakeJob("301", **BUSY_3H)
    slurm = {**listed(leader, SlurmJobId("300", het_job_id="300", het_job_offset="0")),
             **listed(other, SlurmJobId("301", het_job_id="300", het_job_offset="1"))}
    decisions = run([leader, other], sent={"300": DUE, "301": DUE}, slurm=slurm)
    assert (decisions["300"].action, decisions["300"].doubtful) == ("skip", True)
    assert "het job 300 is cancelled only whole" in decisions["300"].reason
    assert "300+1 is not due (none:" in decisions["300"].reason
    assert decisions["301"].action == "none"


def test_het_component_without_gpu_series_keeps_the_het_job_from_a_cancel() -> None:
    """A CPU-only component cannot be judged idle: cancelling the whole het job would end
    its work too."""
    leader = FakeJob("300", **IDLE_3H)
    cpu_part = SlurmJob("301", "ann", "lab", "gpu", "normal", "train", "RUNNING", ("gpu01",),
                        0, ident=SlurmJobId("301", het_job_id="300", het_job_offset="1"))
    slurm = {**listed(leader, SlurmJobId("300", het_job_id="300", het_job_offset="0")),
             "301": cpu_part}
    decision = run([leader], sent={"300": DUE}, slurm=slurm)["300"]
    assert (decision.action, decision.doubtful) == ("skip", True)
    assert "300+1 has no GPU series to judge" in decision.reason


def test_het_job_idle_in_every_component_is_cancelled_once_whole() -> None:
    leader, other = FakeJob("300", **IDLE_3H), FakeJob("301", **IDLE_3H)
    slurm = {**listed(leader, SlurmJobId("300", het_job_id="300", het_job_offset="0")),
             **listed(other, SlurmJobId("301", het_job_id="300", het_job_offset="1"))}
    decisions = run([leader, other], sent={"300": DUE, "301": DUE}, slurm=slurm)
    assert decisions["300"].action == "cancel" and decisions["300"].target == "300"
    assert [j.jobid for j in decisions["300"].components] == ["300", "301"]
    assert decisions["301"].action == "skip" and not decisions["301"].doubtful
    assert "goes with the cancel of its het job 300" in decisions["301"].reason


def test_job_whose_identity_slurm_did_not_say_is_doubtful() -> None:
    job = FakeJob("250", **IDLE_3H)
    for ident in (None, SlurmJobId("250", "250")):  # unreadable; the array's remainder
        decision = run([job], sent={"250": DUE}, slurm=listed(job, ident))["250"]  # type: ignore[arg-type]
        assert (decision.action, decision.doubtful) == ("skip", True)
        assert "which array task or het job component" in decision.reason


def test_table_and_json_show_the_array_task_as_users_know_it() -> None:
    holder = FakeJob("243", **IDLE_3H)
    decisions = list(run([holder], sent={"243": DUE},
                         slurm=listed(holder, SlurmJobId("243", "243", "1"))).values())
    record = json.loads(decisions_json(decisions, True, 14))["decisions"][0]
    assert (record["jobid"], record["job"], record["target"]) == ("243", "243_1", "243_1")
    row = next(line for line in decisions_table(decisions, True).splitlines()
               if " ann " in line)
    assert row.split()[0] == "243_1"


# --- the re-check right before a cancel ---------------------------------------------

def _squeue(*records: dict[str, object]) -> dict[str, SlurmJob]:
    base = {"user_name": "ann", "job_state": "RUNNING", "start_time": 1000}
    return parse_squeue_json(json.dumps({"jobs": [{**base, **r} for r in records]}))


TASK_1 = {"job_id": 243, "array_job_id": 243, "array_task_id": 1}
TASK_0 = {"job_id": 244, "array_job_id": 243, "array_task_id": 0}


def test_recheck_passes_when_slurm_lists_the_same_task_and_start() -> None:
    seen = _squeue(TASK_1, TASK_0)
    assert same_as_listed([seen["243"]], _squeue(TASK_0, TASK_1))


def test_recheck_refuses_a_cancel_when_the_identity_differs() -> None:
    seen = _squeue(TASK_1)["243"]
    # The same job id, now a plain job or another task (ids reused, the array changed):
    # an A_T or bare id built from the old view would name something else.
    for now in ({"job_id": 243}, {**TASK_1, "array_task_id": 2},
                {**TASK_1, "array_job_id": 240}):
        assert not same_as_listed([seen], _squeue(now)), now
    assert not same_as_listed([seen], _squeue({**TASK_1, "start_time": 2000}))  # requeued
    assert not same_as_listed([seen], _squeue({**TASK_1, "job_state": "PENDING"}))
    assert not same_as_listed([seen], _squeue(TASK_0))  # gone


def test_recheck_of_a_het_job_wants_every_component_and_no_more() -> None:
    lead = {"job_id": 300, "het_job_id": 300, "het_job_offset": 0}
    part = {"job_id": 301, "het_job_id": 300, "het_job_offset": 1}
    seen = _squeue(lead, part)
    both = [seen["300"], seen["301"]]
    assert same_as_listed(both, _squeue(lead, part))
    assert not same_as_listed(both, _squeue(lead))
    assert not same_as_listed([seen["300"]], _squeue(lead, part))  # a component more
    assert not same_as_listed(both, _squeue(lead, {**part, "het_job_offset": 2}))
