"""The real agent process and its --training.relay flag over a synthetic node."""

from __future__ import annotations

import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu_exporter.sim.synthnode import SynthNode
from tests.support import wait_until
from tests.support.agent import Agent, series

pytestmark = pytest.mark.process


@pytest.fixture
def node() -> Iterator[SynthNode]:
    # A short base: the socket path must fit in 107 bytes.
    with tempfile.TemporaryDirectory(prefix="sge-flag-") as base:
        yield SynthNode(Path(base))


def _source_up(agent: Agent) -> dict[str, float]:
    return {labels["source"]: v for labels, v in
            series(agent.metrics(), "slurm_gpu_exporter_source_up")}


def test_the_relay_is_on_by_default_and_its_socket_goes_with_the_agent(node, tmp_path):
    sock = node.spool_dir / "training.sock"
    agent = Agent(node.agent_args(0.2), log_path=tmp_path / "agent.log")
    try:
        agent.wait_ready()
        mode = sock.lstat().st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o666
        wait_until(lambda: _source_up(agent).get("training") == 1)
        assert "training relay listening on " + str(sock) in agent.log()
    finally:
        assert agent.stop() == 0
    assert not sock.exists()


def test_no_training_relay_means_no_socket_and_no_training_source(node, tmp_path):
    agent = Agent(node.agent_args(0.2, "--no-training.relay"), log_path=tmp_path / "agent.log")
    try:
        agent.wait_ready()
        assert "spool" in _source_up(agent) and "training" not in _source_up(agent)
        assert not (node.spool_dir / "training.sock").exists()
    finally:
        agent.stop()


def test_a_relay_that_cannot_start_is_one_log_line_and_the_agent_runs_without_it(tmp_path):
    # A spool dir whose socket path is over the 107 bytes a unix socket address holds.
    node = SynthNode(tmp_path / ("n" * 110))
    agent = Agent(node.agent_args(0.2), log_path=tmp_path / "agent.log")
    try:
        agent.wait_ready()
        assert "spool" in _source_up(agent) and "training" not in _source_up(agent)
    finally:
        assert agent.stop() == 0
    lines = [line for line in agent.log().splitlines() if "training" in line]
    assert len(lines) == 1, agent.log()
    assert "level=ERROR" in lines[0] and "training relay not started" in lines[0]
    assert "too long" in lines[0] and "Traceback" not in agent.log()


def test_the_relay_makes_a_missing_spool_dir(tmp_path):
    base = Path(tempfile.mkdtemp(prefix="sge-flag-"))
    try:
        node = SynthNode(base)
        node.spool_dir.rmdir()
        agent = Agent(node.agent_args(0.2), log_path=tmp_path / "agent.log")
        try:
            agent.wait_ready()
            assert (node.spool_dir / "training.sock").is_socket()
            assert stat.S_IMODE(node.spool_dir.stat().st_mode) == 0o755
        finally:
            agent.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
