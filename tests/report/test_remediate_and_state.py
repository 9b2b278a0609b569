"""remediate's choices on fixed alerts (the drain recorded, not run), enforce's state
file, and the flags enforce refuses before asking anyone anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_gpu_exporter.report.cli.main import main
from slurm_gpu_exporter.report.enforce.state import EnforceState
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.remediate.webhook import Remediator
from slurm_gpu_exporter.report.slurm.actions import inert


def remediator(state: str = "IDLE") -> tuple[Remediator, list[tuple[str, str]]]:
    drains: list[tuple[str, str]] = []
    return Remediator(drain=lambda node, reason: drains.append((node, reason)),
                      state_of=lambda node: state), drains


def alert(name: str = "SlurmGpuLost", status: str = "firing", **labels: str) -> dict:
    return {"status": status, "fingerprint": "abc", "startsAt": "2026-12-01T10:00:00Z",
            "labels": {"alertname": name, "instance": "gpu07:9817", "gpu": "3",
                       "uuid": "GPU-x", **labels}}


def test_allowed_firing_alert_drains_the_node_of_its_instance_once() -> None:
    rem, drains = remediator()
    assert rem.handle(alert()) == "drained gpu07"
    assert rem.handle(alert()) == "ignored: acted on this alert before"
    assert len(drains) == 1
    node, reason = drains[0]
    assert node == "gpu07" and "SlurmGpuLost" in reason and "gpu 3" in reason


def test_a_new_firing_of_the_same_alert_acts_again() -> None:
    rem, drains = remediator()
    rem.handle(alert())
    again = alert()
    again["startsAt"] = "2026-12-02T10:00:00Z"
    assert rem.handle(again) == "drained gpu07"
    assert len(drains) == 2


def test_node_already_drained_keeps_its_reason() -> None:
    rem, drains = remediator(state="MIXED+DRAIN")
    assert rem.handle(alert()).startswith("ignored: gpu07 is already")
    assert drains == []


def test_resolved_unlisted_and_hostile_alerts_drain_nothing() -> None:
    rem, drains = remediator()
    assert rem.handle(alert(status="resolved")).startswith("ignored: not firing")
    assert rem.handle(alert("SlurmGpuTemperatureHigh")) == "ignored: alert not in the allow-list"
    for bad in ("-h", "gpu07 State=RESUME", "gpu07,gpu08", "", "a" * 200):
        assert rem.handle(alert(instance=bad)) == "refused: not a node name", bad
    assert drains == []


def test_label_text_in_the_reason_is_reduced_to_safe_characters() -> None:
    rem, drains = remediator()
    rem.handle(alert(uuid='GPU-1" Reason=x\n$(reboot)'))
    reason = drains[0][1]
    assert '"' not in reason and "\n" not in reason and "$" not in reason
    assert inert("a\x1b[2Jb") == "a__2Jb"


def test_dry_run_drains_nothing() -> None:
    rem, drains = remediator()
    rem.dry_run = True
    assert rem.handle(alert()) == "dry run: would drain gpu07"
    assert drains == []


def test_state_file_is_written_whole_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "enforce.json"
    state = EnforceState(path)
    state.add_warning("12", 100.0)
    state.add_warning("12", 200.0)
    state.add_warning("13", 300.0)
    assert EnforceState(path).warnings() == {"12": [100.0, 200.0], "13": [300.0]}
    state.keep_only({"13"})
    assert json.loads(path.read_text()) == {"jobs": {"13": {"warnings": [300.0]}}}
    assert [p.name for p in path.parent.iterdir()] == ["enforce.json"]  # no temp file left


def test_broken_state_file_stops_the_run(tmp_path: Path) -> None:
    path = tmp_path / "enforce.json"
    path.write_text("{not json")
    with pytest.raises(ReportError) as err:
        EnforceState(path)
    assert "enforce state" in str(err.value)


def test_cancel_without_a_notify_channel_is_refused_before_any_query(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("")
    code = main(["enforce", "--policy", str(policy), "--cancel",
                 "--prometheus-url", "http://127.0.0.1:9"])
    assert code == 2
    assert "--notify" in capsys.readouterr().err
