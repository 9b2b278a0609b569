"""The node ``remediate`` would drain is the one Slurm lists under exactly the name
asked: scontrol's answer (given here as its text) naming another node, several nodes
or none gives no node. The real scontrol runs in tests/report/remediate/test_remediate_slurm.py."""

from __future__ import annotations

import subprocess

import pytest

from slurm_gpu_exporter.report.slurm import actions
from slurm_gpu_exporter.report.slurm.actions import SlurmNode, listed_node


def _scontrol(monkeypatch: pytest.MonkeyPatch, stdout: str, status: int = 0,
              stderr: str = "") -> list[list[str]]:
    asked: list[list[str]] = []
    monkeypatch.setattr(actions, "_command", lambda name: f"/usr/bin/{name}")

    def answer(argv: list[str]) -> subprocess.CompletedProcess[str]:
        asked.append(argv)
        return subprocess.CompletedProcess(argv, status, stdout, stderr)

    monkeypatch.setattr(actions, "_call", answer)
    return asked


def test_the_node_listed_under_the_name_asked_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _scontrol(monkeypatch, "NodeName=gpu01 Arch=x86_64 State=MIXED+DRAIN Weight=1\n")
    assert listed_node("gpu01") == SlurmNode("gpu01", "MIXED+DRAIN")
    assert asked == [["/usr/bin/scontrol", "-o", "show", "node", "gpu01"]]


@pytest.mark.parametrize("stdout", [
    "NodeName=gpu011 State=IDLE\n",  # another node (a prefix of the name asked)
    "NodeName=gpu01-bmc State=IDLE\n",
    "NodeName=gpu01 State=IDLE\nNodeName=gpu02 State=IDLE\n",  # more than one
    "",  # nothing
    "Comment=NodeName=gpu01 State=IDLE\n",  # the name only inside another field
])
def test_an_answer_naming_another_or_several_nodes_gives_none(
        monkeypatch: pytest.MonkeyPatch, stdout: str) -> None:
    _scontrol(monkeypatch, stdout)
    assert listed_node("gpu01") is None


def test_a_node_slurm_does_not_know_gives_none(monkeypatch: pytest.MonkeyPatch) -> None:
    _scontrol(monkeypatch, "", status=1, stderr="Node gpu01 not found\n")
    assert listed_node("gpu01") is None
