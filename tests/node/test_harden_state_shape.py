"""A state file that is valid JSON of the wrong shape is moved aside; the agent starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_gpu_exporter.node.state_dir import STATE_FILE
from slurm_gpu_exporter.sim.synthnode import SynthNode
from tests.support.agent import Agent

pytestmark = [pytest.mark.process]


@pytest.mark.parametrize("document", [
    {"version": 1, "jobs": []},  # made the agent exit at start, in a restart loop
    {"version": 1, "jobs": {}, "gpu": {"device_busy": [1]}},  # wrong deeper down
], ids=["jobs-a-list", "gpu-part-a-list"])
def test_a_state_file_of_the_wrong_shape_is_moved_aside_and_the_agent_serves(
        tmp_path: Path, document: dict[str, object]) -> None:
    node = SynthNode(tmp_path / "node")
    node.add_job(4100, [5000])
    node.state_dir.mkdir(parents=True, exist_ok=True)
    (node.state_dir / STATE_FILE).write_text(json.dumps(document))
    agent = Agent(node.agent_args(0.5), log_path=tmp_path / "log")
    try:
        agent.wait_ready()
        assert 'jobid="4100"' in agent.metrics()
        aside = [p.name for p in node.state_dir.iterdir() if ".corrupt-" in p.name]
        assert len(aside) == 1, agent.log()
        assert "is unusable" in agent.log()
    finally:
        agent.stop()
