"""Tensor-core and DRAM activity in ``slurm-gpu-report job``: the real agent over the
fake NVML (an H100 with GPM), a real Prometheus, the report's JSON and the mail
wrapper's summary of it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_gpu_exporter.mail.summary import summary_text
from slurm_gpu_exporter.sim.synthnode import SynthNode
from tests.fakenvml import Device, NvmlState, Pattern, Process, fake_nvml_or_skip
from tests.gpu.test_gpu_attribution import GIB, Rig
from tests.support.daemons import Prometheus

pytestmark = [pytest.mark.fakenvml, pytest.mark.prometheus, pytest.mark.process]

REPORT = str(Path(sys.executable).parent / "slurm-gpu-report")


def test_job_report_shows_tensor_and_dram_activity_and_mean_power(tmp_path: Path) -> None:
    fake = fake_nvml_or_skip(tmp_path / "nvml")
    rig = Rig(SynthNode(tmp_path / "node"), fake, tmp_path)
    now = time.time()
    fake.write(NvmlState(devices=[Device(
        0, name="NVIDIA H100 80GB HBM3", gpm={"sm_util": 50.0, "tensor": 10.0, "dram": 40.0},
        processes=[Process(9101, 4 * GIB, sm=Pattern.constant(90), start_time=now)])]))
    rig.node.add_job(91, [9101], job_gpus="0", start_time=now)
    agent = rig.start()
    prom = None
    try:
        prom = Prometheus("prometheus", {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [{"job_name": "slurm-gpu", "static_configs": [
                {"targets": [f"127.0.0.1:{agent.port}"]}]}]}, tmp_path / "prom")
        prom.wait_ready()
        prom.wait_for('slurm_job_gpu_tensor_active_seconds_total{jobid="91"} > 1', timeout=60)
        time.sleep(10)  # a stretch long enough that the first samples' edge is small
        run = subprocess.run([REPORT, "job", "91", "--format", "json", "--no-sacct",
                              "--prometheus-url", prom.url], capture_output=True, text=True,
                             timeout=60, check=False)
    finally:
        if prom is not None:
            prom.stop()
        agent.stop()
    assert run.returncode == 0, run.stderr
    (job,) = json.loads(run.stdout)["jobs"]
    print(f"\nSM {job['sm_active_ratio']:.3f} tensor {job['tensor_active_ratio']:.3f} "
          f"DRAM {job['dram_active_ratio']:.3f} power {job['gpu_power_mean_w']}")
    assert job["sm_active_ratio"] == pytest.approx(0.50, abs=0.05)
    assert job["tensor_active_ratio"] == pytest.approx(0.10, abs=0.03)
    assert job["dram_active_ratio"] == pytest.approx(0.40, abs=0.05)
    (gpu,) = job["gpus_detail"]
    assert gpu["tensor_active_ratio"] == pytest.approx(job["tensor_active_ratio"])
    if job["energy_kwh"] is not None:
        assert job["gpu_power_mean_w"] > 0 and gpu["power_mean_w"] == pytest.approx(
            job["gpu_power_mean_w"])
    text = summary_text(job)
    assert "Tensor active:" in text and "DRAM active:" in text, text
