"""A real Slurm job's GPU energy across SIGKILL restarts of the agent (fake NVML).

The job's GPU draws a constant power, so its energy must be power x allocated time:
each restart's first energy reading credits the time the agent was down to the job,
from the reading saved in the state dir. A driver reload while the agent is down (the
counter restarting lower) counts from the new reading: never negative, and never the
whole new counter.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import time
from functools import partial
from pathlib import Path

import pytest

from tests.fakenvml import Device, FakeNvml, NvmlState, Pattern, Process, fake_nvml_or_skip
from tests.support import wait_until
from tests.support.agent import Agent, series
from tests.support.slurmcluster import SlurmCluster

pytestmark = [pytest.mark.process, pytest.mark.slurm, pytest.mark.fakenvml]

GIB = 1024**3
POWER_W = 200.0
RESTARTS = 10
SAMPLE_S = 0.25
BASE_MJ = 5 * 10**9  # the driver's counter when the test starts: 200 W for about 7 h
RELOAD_MJ = 10**9  # where it restarts after a reload: lower, yet far above the job's total
STEP_S = 0.1  # the fake driver's counter moves in 100 ms steps, as real ones do
# How far apart the agent's NVML read and its sample's timestamp may fall on a loaded
# machine, at each end of the measurement (the restarts in between telescope).
READ_SLACK_S = 0.05
# The energy's allowed distance from power x allocated time: one counter step and the
# slack at both ends. A restart whose downtime was lost (at least MIN_DOWN_S) is twice that.
TOLERANCE_J = POWER_W * (STEP_S + 2 * READ_SLACK_S)
MIN_DOWN_S = 0.4
ENERGY = "slurm_job_gpu_energy_joules_total"
DEVICE_ENERGY = "slurm_gpu_energy_joules_total"  # the driver's counter, since it loaded
ALLOCATED = "slurm_job_gpu_allocated_seconds_total"


class Node:
    """The cluster, the fake NVML and the state dir one agent after another starts over.

    The agents read a spool dir of their own holding the job's record as its prolog
    wrote it: records other runs left in the cluster's spool without an epilog would
    share the job's GPU.
    """

    def __init__(self, cluster: SlurmCluster, fake: FakeNvml, base: Path, jobid: int) -> None:
        self.cluster, self.fake, self.base, self.jobid = cluster, fake, base, jobid
        self.spool = base / "spool"
        self.spool.mkdir(mode=0o755)
        record = f"{jobid}.json"
        shutil.copyfile(cluster.spool_dir / record, self.spool / record)
        self.starts = 0
        self.high: dict[str, float] = {}  # the highest value scraped of each counter
        self.text = ""  # the last scrape

    def start(self) -> Agent:
        self.starts += 1
        agent = Agent(
            ["--spool-dir", str(self.spool), "--state-dir", str(self.base / "state"),
             "--sample-interval", str(SAMPLE_S), "--slurm-lookup", "cli",
             "--node-name", self.cluster.node_name],
            env={**self.fake.env(), **self.cluster.env},
            log_path=self.base / f"agent{self.starts}.log")
        try:
            agent.wait_ready()
        except BaseException:
            kill(agent)
            raise
        return agent

    def scrape(self, agent: Agent) -> tuple[float, float, float] | None:
        """(energy, allocated, last sample time) of the job's GPU, None until it has
        both; a counter below what was scraped before fails the test."""
        text = self.text = agent.metrics()
        got = {}
        for name in (ENERGY, ALLOCATED):
            values = [v for labels, v in series(text, name) if labels["jobid"] == str(self.jobid)]
            if len(values) != 1:
                return None
            assert values[0] >= self.high.get(name, 0.0), (
                f"{name} went down at start {self.starts}: {self.high[name]} -> {values[0]}")
            got[name] = self.high[name] = values[0]
        [(_, at)] = series(text, "slurm_gpu_exporter_last_sample_timestamp_seconds")
        return got[ENERGY], got[ALLOCATED], at

    def device_energy(self) -> float | None:
        """The held GPU's own counter in the last scrape; None before the agent has read it."""
        uuids = {labels["uuid"] for labels, _ in series(self.text, ENERGY)
                 if labels["jobid"] == str(self.jobid)}
        values = [v for labels, v in series(self.text, DEVICE_ENERGY) if labels["uuid"] in uuids]
        return values[0] if len(values) == 1 else None

    def reading(self, agent: Agent) -> tuple[float, float, float] | None:
        """(the job's energy, its allocated time, the GPU's counter) in one scrape; None
        until the agent has read the GPU."""
        got = self.scrape(agent)
        device = self.device_energy() if got is not None else None
        return (got[0], got[1], device) if got is not None and device is not None else None

    def after_samples(self, agent: Agent, n: int) -> tuple[float, float, float]:
        """A scrape ``n`` samples after the first one that had the job's series."""
        first = wait_until(lambda: self.scrape(agent), 10, "the job's GPU series",
                           log=agent.log)

        def later() -> tuple[float, float, float] | None:
            got = self.scrape(agent)
            return got if got is not None and got[2] >= first[2] + n * SAMPLE_S - 0.01 else None

        return wait_until(later, 10, f"{n} more samples", log=agent.log)


def kill(agent: Agent) -> None:
    agent.proc.send_signal(signal.SIGKILL)
    agent.stop()


def test_job_energy_is_power_times_allocated_time_across_sigkill_restarts_and_a_reload(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    fake = fake_nvml_or_skip(tmp_path / "nvml")
    jobid = slurm_cluster.submit("sleep 300\n", gres="gpu:1")
    rng = random.Random(25)
    agent: Agent | None = None
    try:
        slurm_cluster.wait_state(jobid, "RUNNING", timeout=30)
        pids = wait_until(
            lambda: {p for p in slurm_cluster.job_pids(jobid, "batch")
                     if Path(f"/proc/{p}/comm").read_text().strip() == "sleep"},
            15, "the job's sleep")
        record = json.loads((slurm_cluster.spool_dir / f"{jobid}.json").read_text())
        [minor] = [int(i) for i in record["job_gpus"].split(",")]
        held = Device(minor, power_w=POWER_W, energy_base_mj=BASE_MJ,
                      processes=[Process(min(pids), GIB, sm=Pattern.constant(50))])
        state = NvmlState(devices=[held if i == minor else Device(i) for i in range(4)])
        fake.write(state)
        node = Node(slurm_cluster, fake, tmp_path, jobid)

        baseline: tuple[float, float, float] | None = None
        for _ in range(RESTARTS):
            agent = node.start()
            if baseline is None:
                # From the first agent's second sample on: its first sample starts the
                # allocated time at its own start and the energy at NVML's first answer,
                # a moment later (NVML is initialised and the job looked up in between).
                baseline = node.after_samples(agent, 1)
            wait_until(partial(node.scrape, agent), 10, "the job's GPU series", log=agent.log)
            time.sleep(rng.uniform(0.0, 2 * SAMPLE_S))  # anywhere in the sample cycle
            kill(agent)
            agent = None
            time.sleep(rng.uniform(MIN_DOWN_S, 0.8))  # the downtime: the GPU draws power on
        agent = node.start()
        energy, allocated, _ = node.after_samples(agent, 2)
        assert baseline is not None
        used, held_for = energy - baseline[0], allocated - baseline[1]
        error = used / (POWER_W * held_for) - 1
        print(f"after {RESTARTS} restarts: {used:.0f} J over {held_for:.2f} s allocated, "
              f"{100 * error:+.2f} % off {POWER_W:.0f} W x allocated (from the first sample: "
              f"{100 * (energy / (POWER_W * allocated) - 1):+.2f} %)")
        assert POWER_W * MIN_DOWN_S >= 2 * TOLERANCE_J  # a lost downtime cannot hide
        assert abs(used - POWER_W * held_for) <= TOLERANCE_J, (used, held_for, agent.log())

        # A driver reload while the agent is down: the counter restarts lower.
        kill(agent)
        agent = None
        held.energy_base_mj, held.energy_reset_at = RELOAD_MJ, fake.now()
        fake.write(state)
        time.sleep(0.5)  # the downtime
        agent = node.start()
        # The driver's counter as the new agent first read it, and the job's energy then:
        # on a loaded machine that first reading can come samples after the first scrape,
        # whose GPU figures are the restored ones.
        job_first, _, device_first = wait_until(partial(node.reading, agent), 10,
                                                "the GPU's energy after the reload",
                                                log=agent.log)

        def later_reading() -> tuple[float, float, float] | None:
            # A reading at least two samples' energy on (one 100 ms step short at most).
            got = node.reading(agent)
            return got if got is not None and (
                got[2] >= device_first + 2 * SAMPLE_S * POWER_W - 20) else None

        energy2, allocated2, device2 = wait_until(later_reading, 10, "two more samples' energy",
                                                  log=agent.log)
        added, held_for = energy2 - energy, allocated2 - allocated
        counted, measured = energy2 - job_first, device2 - device_first
        print(f"across the reload: {added:.0f} J added over {held_for:.2f} s allocated; "
              f"{counted:.0f} J since the first reading, the driver counted {measured:.0f} J")
        assert added <= POWER_W * held_for * 1.01, "counted the new counter as energy used"
        # What the driver counted from the agent's first reading on is the job's: it holds
        # the GPU alone.
        assert counted == pytest.approx(measured, rel=0.001, abs=1.0), (counted, measured)
        log = (tmp_path / f"agent{node.starts}.log").read_text()
        assert "energy counter went back" in log, log
    finally:
        if agent is not None:
            kill(agent)
        slurm_cluster.cancel(jobid)
