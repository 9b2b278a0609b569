"""The agent over a simulated node with a node power meter: a synthetic hwmon tree, or
a stand-in site command; its node energy, the jobs' shares and the rest add up."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.support import wait_until
from tests.support.agent import Agent, series

pytestmark = pytest.mark.process


def _node_energy(text: str) -> tuple[float, dict[str, float], float] | None:
    node = series(text, "slurm_node_energy_joules_total")
    if not node or node[0][1] <= 0:
        return None
    jobs = {labels["jobid"]: v for labels, v in series(text, "slurm_job_node_energy_joules_total")}
    outside = series(text, "slurm_node_outside_jobs_energy_joules_total")[0][1]
    return node[0][1], jobs, outside


def _up(text: str) -> float | None:
    found = [v for labels, v in series(text, "slurm_gpu_exporter_source_up")
             if labels["source"] == "nodepower"]
    return found[0] if found else None


def test_a_hwmon_meter_is_integrated_and_shared_among_the_jobs(tmp_path: Path) -> None:
    meter = tmp_path / "hwmon" / "hwmon0"
    meter.mkdir(parents=True)
    (meter / "name").write_text("power_meter\n")
    (meter / "power1_average").write_text("2500000000\n")  # 2.5 kW
    agent = Agent(["--simulate", "--sample-interval", "0.5", "--hwmon-root",
                   str(tmp_path / "hwmon")], log_path=tmp_path / "agent.log")
    try:
        agent.wait_ready()

        def shared() -> tuple[float, dict[str, float], float] | None:
            got = _node_energy(agent.metrics())
            return got if got and sum(got[1].values()) > 0 and got[0] > 5000 else None

        node, jobs, outside = wait_until(shared, 60, "node energy shared among jobs",
                                         log=agent.log)
        assert sum(jobs.values()) + outside == pytest.approx(node, rel=0.005)
        assert _up(agent.metrics()) == 1
        assert series(agent.metrics(), "slurm_node_power_watts")[0][1] == pytest.approx(2500)
    finally:
        agent.stop()


def test_a_failing_site_command_is_the_source_down_not_zero(tmp_path: Path) -> None:
    script = tmp_path / "power"
    script.write_text("#!/bin/sh\necho 'BMC busy' >&2\nexit 1\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    agent = Agent(["--simulate", "--sample-interval", "0.5", "--node-power.command",
                   str(script), "--node-power.command-interval", "1"],
                  log_path=tmp_path / "agent.log")
    try:
        agent.wait_ready()

        def down() -> str | None:
            text = agent.metrics()
            return text if _up(text) == 0 else None

        # down for the command's own failure, not only before its first answer
        wait_until(lambda: "exited with status 1: 'BMC busy'" in agent.log(), 30,
                   "the command's failure in the log", log=agent.log)
        text = wait_until(down, 30, "nodepower down", log=agent.log)
        assert not series(text, "slurm_node_power_watts")
        assert not series(text, "slurm_node_energy_joules_total")
    finally:
        agent.stop()
