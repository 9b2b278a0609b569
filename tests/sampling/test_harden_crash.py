"""SIGKILL at random points of the sample cycle, 50 times in a row, over the same state dir.

A synthetic node (slurm_gpu_exporter/sim/synthnode.py: cgroups, /proc and prolog
records) and the fake NVML (tests/fakenvml) with two running GPU jobs. After every kill
the state file is readable, and the restarted agent's counters are never below what was
scraped before it died; no scrape ever holds the same series twice.
"""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slurm_gpu_exporter.node.state_dir import STATE_FILE
from slurm_gpu_exporter.sim.synthnode import SynthNode
from tests.fakenvml import Device, NvmlState, Pattern, Process, fake_nvml_or_skip
from tests.support.agent import Agent

pytestmark = pytest.mark.fakenvml

GIB = 1024**3
KILLS = 50
COUNTERS = ("slurm_job_cpu_seconds_total", "slurm_job_gpu_busy_seconds_total",
            "slurm_job_gpu_allocated_seconds_total", "slurm_job_gpu_energy_joules_total")


def _scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample by (name, labels); a series that appears twice fails the test."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in out, f"series {key} appears twice"
            out[key] = sample.value
    return out


def _counters(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {k: v for k, v in _scrape(text).items() if k[0] in COUNTERS}


def test_fifty_sigkills_never_lower_a_counter_nor_break_the_state(tmp_path: Path) -> None:
    fake = fake_nvml_or_skip(tmp_path / "nvml")
    real0 = time.time()
    fake.write(NvmlState(time_scale=10.0, time_origin=real0, buffer_samples=1200, devices=[
        Device(0, power_w=200.0, processes=[
            Process(8101, GIB, sm=Pattern.constant(40), start_time=real0)]),
        Device(1, power_w=150.0, processes=[
            Process(8201, GIB, sm=Pattern.constant(70), start_time=real0)]),
    ]))
    node = SynthNode(tmp_path / "node")
    node.add_job(81, [8101], job_gpus="0", start_time=real0)
    node.add_job(82, [8201], job_gpus="1", start_time=real0)
    state = node.state_dir / STATE_FILE
    rng = random.Random(13)
    high: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    cpu = 1.0
    for round_ in range(KILLS):
        cpu += 0.5
        for jobid in (81, 82):
            node.update_job(jobid, cpu_seconds=cpu)
        agent = Agent(node.agent_args(0.2), env=fake.env(),
                      log_path=tmp_path / f"agent{round_}.log")
        try:
            agent.wait_ready()
            for _ in range(2):
                seen = _counters(agent.metrics())
                for key, value in seen.items():
                    assert value >= high.get(key, 0.0), (
                        f"round {round_}: {key} went down: {high[key]} -> {value}")
                    high[key] = value
            # Somewhere in the next sample cycles: mid-sample, mid-save or idle.
            time.sleep(rng.uniform(0.0, 0.45))
        finally:
            agent.proc.send_signal(signal.SIGKILL)
            agent.stop()
        if state.exists():
            data = json.loads(state.read_bytes())  # never left half-written
            assert isinstance(data, dict) and "version" in data
        assert not list(node.state_dir.glob("*.corrupt-*"))
    names = {k[0] for k in high}
    assert names == set(COUNTERS), names
    assert {dict(k[1])["jobid"] for k in high} == {"81", "82"}
