"""GPM activity (SM, tensor, DRAM) per job and per device: the real agent over the fake NVML.

One agent runs a minute of real time over a node with four GPUs. The fake's time
scale cannot shorten this: a GPM metric is a mean between two GPM samples the agent
takes, weighted by the agent's own interval, so only real time passes for it. The
error at the window's edges is the scheduling jitter over the span: 20 s gave 0.67
percentage point on a loaded 2-core machine, over the 0.5 tolerance; 60 s keeps it
near 0.2. (Under pytest-xdist the minute overlaps other tests.)

- GPU 0 has GPM, SM activity 25 %, and is held by job 81 alone; one GPM sample
  read fails part-way through;
- GPU 1 is in MIG mode with three GPU instances, each held by its own job
  (82, 83, 84) and each with its own SM activity;
- GPU 2 has no GPM (an A100): job 85 keeps every other series;
- GPU 3 has GPM and is shared by jobs 86 and 87 (no MIG): device series only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from slurm_gpu_exporter.sim.synthnode import SynthNode
from tests.fakenvml import Device, MigInstance, NvmlState, Pattern, Process, fake_nvml_or_skip
from tests.gpu.test_gpu_attribution import (
    GIB,
    Rig,
    job_gpu,
    labelsets,
    last_sample,
    value,
)

pytestmark = pytest.mark.fakenvml

SPAN = 60.0  # seconds between the two scrapes compared
SM = "slurm_job_gpu_sm_active_seconds_total"
ALLOC = "slurm_job_gpu_allocated_seconds_total"
MIG_SM = {1: 20.0, 2: 50.0, 3: 80.0}  # GPU instance -> SM activity, percent


@dataclass
class GpmNode:
    rig: Rig
    devices: list[Device]
    text_a: str
    text_b: str
    during_error: list[str]  # scrapes taken while the failed GPM read happened
    log: str


def mig_uuid(gi: int) -> str:
    return f"MIG-{gi:08x}-9a3e-4b2c-8d1f-0000000001{gi:02x}"


@pytest.fixture(scope="module")
def gpm_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpmNode]:
    base = tmp_path_factory.mktemp("gpm")
    fake = fake_nvml_or_skip(base / "nvml")
    rig = Rig(SynthNode(base / "node"), fake, base)
    real0 = time.time()
    h100 = "NVIDIA H100 80GB HBM3"
    devices = [
        Device(0, name=h100, gpm={"sm_util": 25.0, "sm_occupancy": 30.0, "tensor": 10.0,
                                  "dram": 40.0, "pcie_tx": 1000.0},
               processes=[Process(8101, 4 * GIB, sm=Pattern.constant(90), start_time=real0)]),
        Device(1, name=h100, gpm={}, mig=[
            MigInstance(gi, uuid=mig_uuid(gi), name="NVIDIA H100 80GB HBM3 MIG 1g.10gb",
                        gpm={"sm_util": MIG_SM[gi]}) for gi in (1, 2, 3)],
               processes=[Process(8200 + gi, GIB, gpu_instance_id=gi, compute_instance_id=0)
                          for gi in (1, 2, 3)]),
        Device(2, processes=[Process(8501, GIB, sm=Pattern.constant(40), start_time=real0)]),
        Device(3, name=h100, gpm={"sm_util": 60.0}, processes=[
            Process(8601, GIB, sm=Pattern.constant(30), start_time=real0),
            Process(8701, GIB, sm=Pattern.constant(30), start_time=real0)]),
    ]  # fmt: skip
    state = NvmlState(devices=devices)
    fake.write(state)
    rig.node.add_job(81, [8101], job_gpus="0", start_time=real0)
    for gi in (1, 2, 3):
        rig.node.add_job(81 + gi, [8200 + gi], job_gpus="1", cuda_visible_devices=mig_uuid(gi),
                         start_time=real0)
    rig.node.add_job(85, [8501], job_gpus="2", start_time=real0)
    rig.node.add_job(86, [8601], job_gpus="3", start_time=real0)
    rig.node.add_job(87, [8701], job_gpus="3", start_time=real0)
    agent = rig.start()
    try:
        text_a = agent.wait_metrics(lambda t: all(
            job_gpu(t, SM, j, g) is not None
            for j, g in ((81, "0"), (82, "1.1"), (83, "1.2"), (84, "1.3"))),
            what="the jobs' SM activity series")  # fmt: skip
        t_a = time.monotonic()
        time.sleep(5.0)
        devices[0].errors_once = {"nvmlGpmSampleGet": "UNKNOWN"}  # the next read fails
        fake.write(state)
        during = []
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            during.append(agent.metrics())
            time.sleep(0.2)
        time.sleep(max(0.0, t_a + SPAN - time.monotonic()))
        text_b = agent.metrics()
    finally:
        agent.stop()
    yield GpmNode(rig, devices, text_a, text_b, during, (base / "agent.log").read_text())


def delta(node: GpmNode, name: str, jobid: int, gpu: str) -> float:
    a, b = job_gpu(node.text_a, name, jobid, gpu), job_gpu(node.text_b, name, jobid, gpu)
    assert a is not None and b is not None, (name, jobid, gpu)
    return b - a


def device_rate(node: GpmNode, name: str, gpu: str) -> float:
    a, b = value(node.text_a, name, gpu=gpu), value(node.text_b, name, gpu=gpu)
    assert a is not None and b is not None, (name, gpu)
    return (b - a) / (last_sample(node.text_b) - last_sample(node.text_a))


def test_whole_gpu_job_sm_active_over_allocated_is_its_sm_activity(gpm_node: GpmNode) -> None:
    d_sm, d_alloc = delta(gpm_node, SM, 81, "0"), delta(gpm_node, ALLOC, 81, "0")
    ratio = d_sm / d_alloc
    life = job_gpu(gpm_node.text_b, SM, 81, "0") / job_gpu(gpm_node.text_b, ALLOC, 81, "0")
    busy = delta(gpm_node, "slurm_job_gpu_busy_seconds_total", 81, "0") / d_alloc
    print(f"\njob 81 over {d_alloc:.1f} s allocated: busy {busy:.2%}, SM active {ratio:.3%} "
          f"(truth 25 %); over its whole life so far {life:.3%}")
    assert 55.0 <= d_alloc <= 65.0
    assert abs(ratio - 0.25) <= 0.005
    assert abs(life - 0.25) <= 0.005
    assert busy == pytest.approx(0.9, abs=0.02)  # "busy" says 90 %; SMs say 25 %
    for name, share in (("sm_occupancy", 0.30), ("tensor_active", 0.10),
                        ("dram_active", 0.40)):  # fmt: skip
        got = delta(gpm_node, f"slurm_job_gpu_{name}_seconds_total", 81, "0") / d_alloc
        assert abs(got - share) <= 0.005, name
    assert device_rate(gpm_node, "slurm_gpu_sm_active_seconds_total", "0") == pytest.approx(
        0.25, abs=0.005)
    assert device_rate(gpm_node, "slurm_gpu_pcie_transmit_bytes_total", "0") == pytest.approx(
        1000 * 2**20, rel=0.02)


def test_three_mig_instances_in_three_jobs_each_get_their_own_figures(
    gpm_node: GpmNode,
) -> None:
    for gi, percent in MIG_SM.items():
        jobid, gpu = 81 + gi, f"1.{gi}"
        ratio = delta(gpm_node, SM, jobid, gpu) / delta(gpm_node, ALLOC, jobid, gpu)
        assert abs(ratio - percent / 100) <= 0.005, (gpu, ratio)
        got = [lab for lab in labelsets(gpm_node.text_b, SM) if lab["jobid"] == str(jobid)]
        assert got == [{"jobid": str(jobid), "user": "sgeuser", "gpu": gpu,
                        "uuid": mig_uuid(gi)}]
        assert device_rate(gpm_node, "slurm_gpu_sm_active_seconds_total", gpu) == pytest.approx(
            percent / 100, abs=0.005)
    # Nothing on the MIG parent, and no traffic per instance.
    assert value(gpm_node.text_b, "slurm_gpu_sm_active_seconds_total", gpu="1") is None
    assert {lab["gpu"] for lab in labelsets(gpm_node.text_b,
                                            "slurm_gpu_pcie_transmit_bytes_total")} == {"0", "3"}


def test_gpu_without_gpm_keeps_every_other_series_and_shows_no_gpm_series(
    gpm_node: GpmNode,
) -> None:
    text = gpm_node.text_b
    gpm_names = {n for n in _family_names(text) if "_active_" in n or "_occupancy_" in n
                 or n.startswith(("slurm_gpu_pcie_", "slurm_gpu_nvlink_"))}
    assert SM in gpm_names and "slurm_gpu_sm_active_seconds_total" in gpm_names
    for name in gpm_names:
        assert not [lab for lab in labelsets(text, name) if lab.get("gpu") == "2"], name
    assert delta(gpm_node, "slurm_job_gpu_busy_seconds_total", 85, "2") > 0
    for name in ("slurm_job_gpu_energy_joules_total", "slurm_job_gpu_memory_used_bytes",
                 "slurm_job_gpu_utilization_ratio"):  # fmt: skip
        assert job_gpu(text, name, 85, "2") is not None, name
    assert value(text, "slurm_gpu_power_watts", gpu="2") is not None
    uuid2 = gpm_node.devices[2].uuid
    lines = [ln for ln in gpm_node.log.splitlines() if "no NVML GPM" in ln]
    assert len(lines) == 1 and uuid2 in lines[0], gpm_node.log


def test_gpu_shared_by_two_jobs_gets_device_activity_but_no_job_activity(
    gpm_node: GpmNode,
) -> None:
    text = gpm_node.text_b
    for jobid in (86, 87):
        assert job_gpu(text, "slurm_job_gpu_busy_seconds_total", jobid, "3") is not None
        assert job_gpu(text, SM, jobid, "3") is None
    assert device_rate(gpm_node, "slurm_gpu_sm_active_seconds_total", "3") == pytest.approx(
        0.6, abs=0.005)


def test_gpm_read_that_fails_once_does_not_reset_the_counter(gpm_node: GpmNode) -> None:
    assert "gpm: Unknown Error" in gpm_node.log  # the failure happened while we scraped
    seen = [job_gpu(t, SM, 81, "0") for t in (gpm_node.text_a, *gpm_node.during_error,
                                              gpm_node.text_b)]
    assert None not in seen, seen
    assert seen == sorted(seen), seen  # never went down, never restarted at 0


def _family_names(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
