"""A real Slurm job's GPU processes, reported by the fake NVML by their real PIDs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.fakenvml import Device, NvmlState, Pattern, Process, fake_nvml_or_skip
from tests.support import wait_until
from tests.support.agent import Agent, series
from tests.support.slurmcluster import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.fakenvml]

JOB_SCRIPT = """#!/bin/sh
sleep 120 &
sleep 120 &
wait
"""


def test_slurm_job_gpus_are_attributed_by_real_pid_and_idle_gpu_shows_zero(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    fake = fake_nvml_or_skip(tmp_path / "nvml")
    jobid = slurm_cluster.submit(JOB_SCRIPT, gres="gpu:3")
    agent = None
    try:
        slurm_cluster.wait_state(jobid, "RUNNING", timeout=30)

        def sleeps() -> set[int] | None:  # the script, then its sleeps
            pids = {p for p in slurm_cluster.job_pids(jobid, "batch")
                    if Path(f"/proc/{p}/comm").read_text().strip() == "sleep"}
            return pids if len(pids) >= 2 else None

        pids = wait_until(sleeps, 15, "the job's two processes to start", poll=0.1,
                          log=slurm_cluster.log_tail)
        assert len(pids) == 2, f"the job has more than its two processes: {pids}"
        record = json.loads((slurm_cluster.spool_dir / f"{jobid}.json").read_text())
        held = [int(i) for i in record["job_gpus"].split(",")]  # Slurm index = minor
        assert len(held) == 3
        # NVML enumerates the four GPUs in reverse minor order, as on a real node whose
        # PCI order differs from /dev/nvidiaN: index = 3 - minor.
        devices = [Device(index=i, minor=3 - i) for i in range(4)]
        first, second = sorted(pids)
        devices[3 - held[0]].processes = [Process(first, 3 << 30, sm=Pattern.constant(60))]
        devices[3 - held[1]].processes = [Process(second, 1 << 30, sm=Pattern.constant(20))]
        fake.write(NvmlState(devices=devices))

        agent = Agent(
            ["--spool-dir", str(slurm_cluster.spool_dir), "--state-dir", str(tmp_path / "state"),
             "--sample-interval", "1", "--slurm-lookup", "cli",
             "--node-name", slurm_cluster.node_name],
            env={**fake.env(), **slurm_cluster.env}, log_path=tmp_path / "agent.log",
        )
        agent.wait_ready()

        def job_gpu(name: str) -> dict[str, float]:
            return {labels["gpu"]: value for labels, value in series(agent.metrics(), name)
                    if labels["jobid"] == str(jobid)}

        def three_gpus_with_busy() -> dict[str, float] | None:
            busy = job_gpu("slurm_job_gpu_busy_seconds_total")
            return busy if len(busy) == 3 and sum(busy.values()) > 0 else None

        wait_until(three_gpus_with_busy, 20, "busy time on the job's three GPUs",
                   poll=0.5, log=agent.log)
        time.sleep(3)
        text = agent.metrics()
        by_gpu = {labels["gpu"]: labels for labels, _ in
                  series(text, "slurm_job_gpu_allocated_seconds_total")
                  if labels["jobid"] == str(jobid)}
        busy = job_gpu("slurm_job_gpu_busy_seconds_total")
        util = job_gpu("slurm_job_gpu_utilization_ratio")
        procs = job_gpu("slurm_job_gpu_processes")
        memory = job_gpu("slurm_job_gpu_memory_used_bytes")
        g0, g1, idle = (str(3 - m) for m in held)
        assert set(by_gpu) == {g0, g1, idle}
        for labels in by_gpu.values():
            assert labels["user"] == "sgeuser"
            assert labels["uuid"].startswith("GPU-")
        assert procs == {g0: 1, g1: 1, idle: 0}
        assert memory[g0] == 3 << 30 and memory[g1] == 1 << 30 and memory[idle] == 0
        assert util[g0] == pytest.approx(0.6, abs=0.03)
        assert util[g1] == pytest.approx(0.2, abs=0.03)
        assert busy[idle] == 0 and util[idle] == 0
        gpus = {labels["jobid"]: v for labels, v in series(text, "slurm_job_gpus")}
        assert gpus[str(jobid)] == 3
    finally:
        if agent is not None:
            agent.stop()
        slurm_cluster.cancel(jobid)


def test_requeued_job_starts_new_gpu_counters(slurm_cluster: SlurmCluster,
                                              tmp_path: Path) -> None:
    """A job requeued onto the same node keeps its id; its new run's GPU counters start
    at 0, not at the first run's totals."""
    fake = fake_nvml_or_skip(tmp_path / "nvml")
    fake.write(NvmlState(devices=[Device(index=i, minor=3 - i) for i in range(4)]))
    jobid = slurm_cluster.submit("sleep 300\n", gres="gpu:1", extra_args=["--requeue"])
    agent = None
    try:
        slurm_cluster.wait_state(jobid, "RUNNING", timeout=30)
        agent = Agent(
            ["--spool-dir", str(slurm_cluster.spool_dir), "--state-dir", str(tmp_path / "state"),
             "--sample-interval", "1", "--slurm-lookup", "cli",
             "--node-name", slurm_cluster.node_name],
            env={**fake.env(), **slurm_cluster.env}, log_path=tmp_path / "agent.log",
        )
        agent.wait_ready()

        def job_value(text: str, name: str) -> float | None:
            found = [v for labels, v in series(text, name) if labels["jobid"] == str(jobid)]
            return found[0] if len(found) == 1 else None

        def first_run() -> str | None:
            text = agent.metrics()
            alloc = job_value(text, "slurm_job_gpu_allocated_seconds_total")
            return text if alloc is not None and alloc >= 4.0 else None

        first = wait_until(first_run, 30, "4 s of allocated GPU time in the first run",
                           poll=0.5, log=agent.log)
        old_start = job_value(first, "slurm_job_start_time_seconds")
        assert old_start is not None
        slurm_cluster.run(["scontrol", "requeue", str(jobid)])
        slurm_cluster.wait_state(jobid, "PENDING", timeout=30)
        record = slurm_cluster.spool_dir / f"{jobid}.json"
        wait_until(
            lambda: slurm_cluster.job_cgroup_dir(jobid) is None
            and (not record.exists() or json.loads(record.read_bytes())["end_time"]),
            30, "the first run's epilog and the end of its cgroup", poll=0.5, log=agent.log)
        # slurmd refuses a credential issued in the same second as the kill of the first
        # run ("Job credential revoked"); it compares whole seconds.
        time.sleep(1.1)
        # A requeued job waits about two minutes before it may start again.
        slurm_cluster.run(["scontrol", "update", f"jobid={jobid}", "starttime=now"])
        slurm_cluster.wait_state(jobid, "RUNNING", timeout=30)

        seen: list[str] = []

        def new_run() -> str | None:
            text = agent.metrics()
            seen[:] = [ln for ln in text.splitlines() if f'jobid="{jobid}"' in ln]
            start = job_value(text, "slurm_job_start_time_seconds") or 0
            alloc = job_value(text, "slurm_job_gpu_allocated_seconds_total")
            return text if start > old_start and alloc is not None else None

        try:
            text = wait_until(new_run, 30, "the new run's GPU series", poll=0.5, log=agent.log)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nthe job's last series:\n" + "\n".join(seen)) from None
        new_start = job_value(text, "slurm_job_start_time_seconds")
        alloc = job_value(text, "slurm_job_gpu_allocated_seconds_total")
        [(_, at)] = series(text, "slurm_gpu_exporter_last_sample_timestamp_seconds")
        assert new_start is not None and alloc is not None
        assert alloc <= at - new_start + 1.0, (
            f"the new run shows {alloc:.1f} s allocated {at - new_start:.1f} s after its start "
            "(the first run's total carried over)")
    finally:
        if agent is not None:
            agent.stop()
        slurm_cluster.cancel(jobid)
