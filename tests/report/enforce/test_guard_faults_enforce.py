"""enforce's last guards before a cancel, on plain values: the ``squeue`` re-check of
the job right before ``scancel`` (its answer given as squeue's JSON text), the one name
a command is given, and what ``act_on`` does with each answer. The Slurm commands are
stood in for by functions that record their calls; the real ones run in
tests/report/enforce/test_enforce_*_slurm.py and test_enforce_faults.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_gpu_exporter.model.slurm_id import SlurmJobId
from slurm_gpu_exporter.report.enforce import run
from slurm_gpu_exporter.report.enforce.decisions import Decision
from slurm_gpu_exporter.report.enforce.policy import parse_policy
from slurm_gpu_exporter.report.enforce.run import EXIT_DOUBTFUL, EnforceOptions, act_on
from slurm_gpu_exporter.report.enforce.state import EnforceState
from slurm_gpu_exporter.report.prometheus.queries import Filters
from slurm_gpu_exporter.report.slurm import actions
from slurm_gpu_exporter.report.slurm.squeue import SlurmJob, parse_squeue_json

NOW = 1_800_000_000.0
RECORD = {"job_id": 42, "user_name": "ann", "job_state": "RUNNING", "start_time": 1_799_990_000}
LISTED = parse_squeue_json(json.dumps({"jobs": [RECORD]}))["42"]


def _squeue_answer(monkeypatch: pytest.MonkeyPatch, *jobs: dict) -> list[list[str]]:  # type: ignore[type-arg]
    """``squeue --json --jobs N`` answers with ``jobs`` (22.05 lists every job whatever
    --jobs says); the argument lists asked."""
    asked: list[list[str]] = []
    monkeypatch.setattr(actions, "_command", lambda name: f"/usr/bin/{name}")

    def answer(argv: list[str]) -> str:
        asked.append(argv)
        return json.dumps({"jobs": list(jobs)})

    monkeypatch.setattr(actions, "_run", answer)
    return asked


def test_the_recheck_asks_squeue_for_exactly_that_job(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _squeue_answer(monkeypatch, RECORD, {**RECORD, "job_id": 43})
    assert actions.still_as_listed([LISTED])
    assert asked == [["/usr/bin/squeue", "--json", "--states=all", "--jobs", "42"]]


@pytest.mark.parametrize("now_listed, why", [
    ({"job_id": 42, "user_name": "ann", "job_state": "RUNNING", "start_time": 1_799_999_000},
     "requeued since: it started again later"),
    ({"job_id": 42, "user_name": "ann", "job_state": "PENDING"}, "requeued, pending"),
    ({"job_id": 42, "user_name": "ann", "job_state": "COMPLETING",
      "start_time": 1_799_990_000}, "ending"),
    ({**RECORD, "job_id": 43}, "gone; squeue 22.05 lists another job anyway"),
    (None, "gone from squeue"),
])
def test_a_job_not_running_as_listed_fails_the_recheck(monkeypatch: pytest.MonkeyPatch,
                                                       now_listed: dict | None,  # type: ignore[type-arg]
                                                       why: str) -> None:
    _squeue_answer(monkeypatch, *([now_listed] if now_listed else []))
    assert not actions.still_as_listed([LISTED]), why


def test_a_job_without_its_identity_is_never_asked_for_nor_passes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _squeue_answer(monkeypatch, RECORD)
    assert not actions.still_as_listed([SlurmJob("42", "ann", "lab", "gpu", "normal", "train",
                                                 "RUNNING", ("gpu01",), 1,
                                                 start=1_799_990_000)])
    assert not actions.still_as_listed([])
    assert asked == []


def test_a_command_gets_the_one_name_of_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _squeue_answer(monkeypatch)
    actions.cancel_job(SlurmJobId("244", "243", "1"))  # the task, never the array's id
    actions.cancel_job(SlurmJobId("301", het_job_id="300", het_job_offset="1"))  # whole
    actions.record_reason(SlurmJobId("42"), "idle")
    assert asked == [["/usr/bin/scancel", "243_1"], ["/usr/bin/scancel", "300"],
                     ["/usr/bin/scontrol", "update", "JobId=42", "AdminComment=idle"]]


def test_an_arrays_unsplit_remainder_never_reaches_a_command(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Its id names every task of the array. Ids with more than digits are refused when
    # the identity is made (tests/model/test_slurm_id.py).
    asked = _squeue_answer(monkeypatch)
    with pytest.raises(actions.ReportError, match="no Slurm job id names that job alone"):
        actions.cancel_job(SlurmJobId("243", "243"))
    with pytest.raises(actions.ReportError, match="no Slurm job id names that job alone"):
        actions.record_reason(SlurmJobId("243", "243"), "idle")
    assert asked == []


def test_all_is_no_node_name() -> None:
    assert actions.is_node_name("gpu01")
    for many in ("ALL", "all", "gpu[01-02]", "gpu01,gpu02", "-gpu01"):
        assert not actions.is_node_name(many), many


def _cancel_decision(slurm: SlurmJob | None = LISTED) -> Decision:
    return Decision("42", "ann", "lab", "gpu", "train", 1, ("gpu01",), 7200.0, "cancel",
                    "idle for 2h", slurm=slurm, components=(slurm,) if slurm else ())


class Slurm:
    """Stands in for the three actions ``act_on`` calls; records them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, still_listed: bool) -> None:
        self.calls: list[tuple[str, str]] = []
        self.still_listed = still_listed
        monkeypatch.setattr(run, "still_as_listed", self._recheck)
        monkeypatch.setattr(run, "record_reason",
                            lambda j, r: self.calls.append(("reason", j.target)))
        monkeypatch.setattr(run, "cancel_job", lambda j: self.calls.append(("scancel", j.target)))

    def _recheck(self, jobs: tuple[SlurmJob, ...]) -> bool:
        self.calls.append(("squeue", ",".join(j.jobid for j in jobs)))
        return self.still_listed


def _options(tmp_path: Path) -> EnforceOptions:
    return EnforceOptions(parse_policy(""), cancel=True, state_path=tmp_path / "state.json",
                          filters=Filters())


def test_a_cancel_asks_squeue_again_first_then_records_then_cancels(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    slurm = Slurm(monkeypatch, still_listed=True)
    state = EnforceState(tmp_path / "state.json")
    assert act_on(_cancel_decision(), state, _options(tmp_path), NOW) == 0
    assert slurm.calls == [("squeue", "42"), ("reason", "42"), ("scancel", "42")]
    assert state.jobs["42"]["cancelled"] == NOW


def test_a_job_requeued_or_ended_since_the_listing_is_not_cancelled(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    slurm = Slurm(monkeypatch, still_listed=False)
    state = EnforceState(tmp_path / "state.json")
    assert act_on(_cancel_decision(), state, _options(tmp_path), NOW) == EXIT_DOUBTFUL
    assert slurm.calls == [("squeue", "42")]  # asked, and nothing done
    assert "42" not in state.jobs


def test_a_cancel_without_slurms_listing_is_not_carried_out(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    slurm = Slurm(monkeypatch, still_listed=True)
    state = EnforceState(tmp_path / "state.json")
    assert act_on(_cancel_decision(None), state, _options(tmp_path), NOW) == EXIT_DOUBTFUL
    assert slurm.calls == []
