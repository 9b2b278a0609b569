"""enforce's last guards before a cancel, on plain values: the ``squeue`` re-check of
the job right before ``scancel`` (its answer given as squeue's JSON text) and what
``act_on`` does with each answer. The Slurm commands are stood in for by functions
that record their calls; the real ones run in tests/integration/test_enforce_*.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_gpu_exporter.report.enforce import run
from slurm_gpu_exporter.report.enforce.decisions import Decision
from slurm_gpu_exporter.report.enforce.policy import parse_policy
from slurm_gpu_exporter.report.enforce.run import EXIT_DOUBTFUL, EnforceOptions, act_on
from slurm_gpu_exporter.report.enforce.state import EnforceState
from slurm_gpu_exporter.report.prometheus.queries import Filters
from slurm_gpu_exporter.report.slurm import actions
from slurm_gpu_exporter.report.slurm.squeue import SlurmJob

NOW = 1_800_000_000.0
LISTED = SlurmJob("42", "ann", "lab", "gpu", "normal", "train", "RUNNING", ("gpu01",), 1,
                  start=1_799_990_000)


def _squeue_answer(monkeypatch: pytest.MonkeyPatch, *jobs: dict) -> list[list[str]]:  # type: ignore[type-arg]
    """``squeue --json --jobs N`` answers with ``jobs``; the argument lists asked."""
    asked: list[list[str]] = []
    monkeypatch.setattr(actions, "_command", lambda name: f"/usr/bin/{name}")

    def answer(argv: list[str]) -> str:
        asked.append(argv)
        return json.dumps({"jobs": list(jobs)})

    monkeypatch.setattr(actions, "_run", answer)
    return asked


def test_the_recheck_asks_squeue_for_exactly_that_job(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _squeue_answer(monkeypatch, {"job_id": 42, "user_name": "ann",
                                         "job_state": "RUNNING", "start_time": 1_799_990_000})
    assert actions.still_as_listed(LISTED)
    assert asked == [["/usr/bin/squeue", "--json", "--jobs", "42"]]


@pytest.mark.parametrize("now_listed, why", [
    ({"job_id": 42, "user_name": "ann", "job_state": "RUNNING", "start_time": 1_799_999_000},
     "requeued since: it started again later"),
    ({"job_id": 42, "user_name": "ann", "job_state": "PENDING"}, "requeued, pending"),
    ({"job_id": 42, "user_name": "ann", "job_state": "COMPLETING",
      "start_time": 1_799_990_000}, "ending"),
    (None, "gone from squeue"),
])
def test_a_job_not_running_as_listed_fails_the_recheck(monkeypatch: pytest.MonkeyPatch,
                                                       now_listed: dict | None,  # type: ignore[type-arg]
                                                       why: str) -> None:
    _squeue_answer(monkeypatch, *([now_listed] if now_listed else []))
    assert not actions.still_as_listed(LISTED), why


def test_a_job_id_with_more_than_digits_never_reaches_a_command() -> None:
    for bad in ("42 --all", "42,43", "-1", "42_1x", "", "٤٢"):
        with pytest.raises(actions.ReportError, match="not a Slurm job id"):
            actions.cancel_job(bad)


def test_all_is_no_node_name() -> None:
    assert actions.is_node_name("gpu01")
    for many in ("ALL", "all", "gpu[01-02]", "gpu01,gpu02", "-gpu01"):
        assert not actions.is_node_name(many), many


def _cancel_decision(slurm: SlurmJob | None = LISTED) -> Decision:
    return Decision("42", "ann", "lab", "gpu", "train", 1, ("gpu01",), 7200.0, "cancel",
                    "idle for 2h", slurm=slurm)


class Slurm:
    """Stands in for the three actions ``act_on`` calls; records them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, still_listed: bool) -> None:
        self.calls: list[tuple[str, str]] = []
        self.still_listed = still_listed
        monkeypatch.setattr(run, "still_as_listed", self._recheck)
        monkeypatch.setattr(run, "record_reason", lambda j, r: self.calls.append(("reason", j)))
        monkeypatch.setattr(run, "cancel_job", lambda j: self.calls.append(("scancel", j)))

    def _recheck(self, job: SlurmJob) -> bool:
        self.calls.append(("squeue", job.jobid))
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
