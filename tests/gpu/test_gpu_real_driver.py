"""The agent against what real NVIDIA drivers do and the idealised fake did not.

Each test runs the real agent over the fake NVML's real-driver defaults (device
samples on CLOCK_BOOTTIME, process samples on the epoch, one staggered process sample
per read, no samples while idle; tests/fakenvml/README.md) at real time (time scale
1), so that the boot clock the fake stamps on is the host's own.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_gpu_exporter.sim.synthnode import SynthNode
from tests.fakenvml import Device, NvmlState, Pattern, Process, fake_nvml_or_skip
from tests.fakenvml.clock_shim import booted_env
from tests.gpu.test_gpu_attribution import (
    GIB,
    Rig,
    job_gpu,
    last_sample,
    value,
    wait_samples,
)
from tests.support import wait_until
from tests.support.agent import Agent

pytestmark = [pytest.mark.process, pytest.mark.fakenvml]

BOOT_ID = Path("sys/kernel/random/boot_id")  # under the /proc the agent is given

BUSY = "slurm_job_gpu_busy_seconds_total"
ALLOCATED = "slurm_job_gpu_allocated_seconds_total"
UTIL = "slurm_job_gpu_utilization_ratio"


def write_boot_id(node: SynthNode) -> str:
    """A new boot: a new /proc/sys/kernel/random/boot_id in the node's /proc."""
    boot_id = str(uuid.uuid4())
    path = node.proc_root / BOOT_ID
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(boot_id + "\n")
    return boot_id


def busy_of(text: str, jobid: int, gpu: str = "0") -> float:
    got = job_gpu(text, BUSY, jobid, gpu)
    assert got is not None, text
    return got


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    node = SynthNode(tmp_path / "node")
    write_boot_id(node)
    return Rig(node, fake_nvml_or_skip(tmp_path / "nvml"), tmp_path)


# ------------------------------------------------------ a node of three GPUs


@dataclass
class DriverNode:
    rig: Rig
    agent: Agent
    text_a: str  # once every job has busy time
    text_mid: str  # in the idle phase of GPU 2's job
    text_b: str  # a few samples after text_a
    gpu2_util: Pattern  # GPU 2's busy trace: the truth its job's figures are held to


@pytest.fixture(scope="module")
def driver_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DriverNode]:
    """Three GPUs, each showing one driver habit:

    - GPU 0: jobs 91 (pid 9100, 30 %) and 92 (pid 9109, 50 %) share it; the driver
      hands out pid 9109's samples 4.5 s late (staggered), pid 9100's current;
    - GPU 1: jobs 94 (pid 9400, 65 % reported as 130 %) and 95 (pid 9401, 50 %);
    - GPU 2: job 93 busy 100 % for 1.5 s of every 4.5 s; the buffer runs dry between.
    """
    base = tmp_path_factory.mktemp("driver")
    node = SynthNode(base / "node")
    write_boot_id(node)
    rig = Rig(node, fake_nvml_or_skip(base / "nvml"), base)
    real0 = time.time()
    gpu2_util = Pattern.square(1.5, 4.5, origin=real0 + 1.0)
    before = real0 - 10.0  # traces start earlier: the late samples exist from the start
    rig.fake.write(NvmlState(devices=[
        Device(0, processes=[Process(9100, GIB, sm=Pattern.constant(30), start_time=before),
                             Process(9109, GIB, sm=Pattern.constant(50), start_time=before)]),
        Device(1, processes=[Process(9400, GIB, sm=Pattern.constant(65), start_time=before,
                                     sm_scale=2.0),
                             Process(9401, GIB, sm=Pattern.constant(50), start_time=before)]),
        Device(2, util=gpu2_util,
               processes=[Process(9300, GIB, sm=Pattern.constant(100), start_time=before)]),
    ]))  # fmt: skip
    for jobid, pid, gpu in ((91, 9100, "0"), (92, 9109, "0"), (94, 9400, "1"),
                            (95, 9401, "1"), (93, 9300, "2")):
        node.add_job(jobid, [pid], job_gpus=gpu, start_time=real0)
    agent = rig.start()
    try:
        text_a = agent.wait_metrics(lambda t: all(
            (job_gpu(t, BUSY, j, g) or 0) > 0 for j, g in
            ((91, "0"), (94, "1"), (95, "1"), (93, "2"))),
            timeout=15, what="the jobs' busy time")  # fmt: skip
        # Job 92's first samples come 4.5 s late: its test looks at what it got.
        # GPU 2 is idle from 2.5 s into each 4.5 s period on: catch it 1.7 s into that.
        phase = (time.time() - real0 - 1.0) % 4.5
        time.sleep((4.2 - phase) % 4.5)
        text_mid = agent.metrics()
        text_b = wait_samples(agent, 3)
        yield DriverNode(rig, agent, text_a, text_mid, text_b, gpu2_util)
    finally:
        agent.stop()


def test_staggered_process_samples_split_a_shared_gpu_by_both_jobs(
    driver_node: DriverNode,
) -> None:
    a, b = driver_node.text_a, driver_node.text_b
    d91, d92 = busy_of(b, 91) - busy_of(a, 91), busy_of(b, 92) - busy_of(a, 92)
    # Without a cursor per process the late one's samples are all skipped: 100 % / 0 %.
    assert d91 > 0 and d92 > 0
    assert d91 / (d91 + d92) == pytest.approx(30 / 80, abs=0.05)


def test_smutil_above_100_is_clamped_and_counted(driver_node: DriverNode) -> None:
    a, b = driver_node.text_a, driver_node.text_b
    d94, d95 = busy_of(b, 94, "1") - busy_of(a, 94, "1"), busy_of(b, 95, "1") - busy_of(a, 95, "1")
    # 130 % clamped to 100 % against 50 %: 2/3, where the raw values give 130/180.
    assert d94 / (d94 + d95) == pytest.approx(100 / 150, abs=0.02)
    clamped = value(b, "slurm_gpu_driver_events_total", gpu="1", kind="clamped")
    assert clamped is not None and clamped >= 3
    assert value(b, "slurm_gpu_driver_events_total", gpu="0", kind="clamped") is None


def test_an_idle_gpu_whose_buffer_ran_dry_reads_idle_not_its_last_busy_value(
    driver_node: DriverNode,
) -> None:
    mid = driver_node.text_mid
    # 1.7 s into an idle phase without a sample: the last window is idle time.
    assert job_gpu(mid, UTIL, 93, "2") == pytest.approx(0.0, abs=0.02)
    assert value(mid, "slurm_gpu_utilization_ratio", gpu="2") == pytest.approx(0.0, abs=0.02)
    a, b = driver_node.text_a, driver_node.text_b
    d_busy = busy_of(b, 93, "2") - busy_of(a, 93, "2")
    d_alloc = (job_gpu(b, ALLOCATED, 93, "2") or 0) - (job_gpu(a, ALLOCATED, 93, "2") or 0)
    assert d_alloc > 2
    # The window is a few polls, not whole 4.5 s cycles: held to the trace over it.
    truth = driver_node.gpu2_util.mean(last_sample(a), last_sample(b)) / 100
    assert d_busy / d_alloc == pytest.approx(truth, abs=0.12)


# ------------------------------------------------------ boot clock and reboot


def test_boot_clock_samples_give_a_new_job_none_of_the_busy_time_before_its_start(
    rig: Rig,
) -> None:
    """GPU 0 was busy for job 83 until it ended; job 84 starts on it right then. Its
    first window reaches back before its start on the driver's boot clock: trimmed."""
    real0 = time.time()
    busy_proc = Process(8301, GIB, sm=Pattern.constant(100), start_time=real0 - 5)
    state = NvmlState(devices=[Device(0, util=Pattern.constant(100), processes=[busy_proc])])
    rig.fake.write(state)
    rig.node.add_job(83, [8301], job_gpus="0", start_time=real0)
    agent = rig.start()
    try:
        text = agent.wait_metrics(lambda t: (job_gpu(t, BUSY, 83, "0") or 0) > 0.3,
                                  timeout=10, what="job 83's busy time")
        # Right after a poll, so that the next one's window holds 0.5 s of job 83's use.
        polled = last_sample(text)
        wait_until(lambda: last_sample(agent.metrics()) > polled, 5, "a new sample")
        time.sleep(0.5)
        end = time.time()
        state.devices[0].util = Pattern.constant(0)
        state.devices[0].processes = [Process(8401, GIB)]  # job 84's, idle
        rig.fake.write(state)
        rig.node.remove_job(83)
        rig.node.add_job(84, [8401], job_gpus="0", start_time=end)
        text = agent.wait_metrics(lambda t: job_gpu(t, BUSY, 84, "0") is not None,
                                  timeout=5, what="job 84's series")
        text = wait_samples(agent, 2)
    finally:
        agent.stop()
    assert (job_gpu(text, ALLOCATED, 84, "0") or 0) > 1.0
    # Untrimmed, job 84 would get the 0.5 s of job 83's use; what is left is the driver
    # sample (1/6 s) the switch falls in, and the write's delay on a loaded machine
    # (0.076 s was seen).
    assert busy_of(text, 84) <= 0.12, agent.log()
    assert "off the wall clock" not in agent.log()  # the boot clock was recognised


def test_reboot_with_the_state_dir_kept_counts_busy_time_from_the_new_boot(rig: Rig) -> None:
    """Saved cursors are boot-clock values of the old boot, far ahead of the new boot's
    clock: kept, the driver would return no sample for as long as the node had been up.
    The host's uptime has no say: the first boot's agent runs with a boot clock of a
    day, the second's with one of 3 s (the clock shim), and the fake stamps each on
    it, so both agents recognise the boot clock, as on a real node."""
    real0 = time.time()
    rig.fake.write(NvmlState(devices=[Device(0, processes=[
        Process(8501, GIB, sm=Pattern.constant(60), start_time=real0 - 5)])]))  # fmt: skip
    rig.node.add_job(85, [8501], job_gpus="0", start_time=real0)
    agent = rig.start(booted_env(rig.fake.env(), 86400.0), name="agent-boot1")
    try:
        agent.wait_metrics(lambda t: (value(t, "slurm_gpu_busy_seconds_total", gpu="0") or 0) > 0.3,
                           timeout=10, what="busy time in the first boot")
        wait_samples(agent, 1)  # saved to the state dir
    finally:
        agent.stop()
    assert "off the wall clock" not in agent.log()  # the day-old boot clock recognised
    # The reboot: a new boot id, the boot clock restarting 3 s ago, a new job.
    write_boot_id(rig.node)
    rig.node.remove_job(85)
    rebooted = time.time()
    rig.fake.write(NvmlState(devices=[Device(0, processes=[
        Process(8601, GIB, sm=Pattern.constant(60), start_time=rebooted - 3)])]))  # fmt: skip
    rig.node.add_job(86, [8601], job_gpus="0", start_time=rebooted)
    agent = rig.start(booted_env(rig.fake.env(), 3.0), name="agent-boot2")
    try:
        text = agent.wait_metrics(lambda t: (job_gpu(t, BUSY, 86, "0") or 0) > 0.5,
                                  timeout=8, what="busy time after the reboot")
    finally:
        agent.stop()
    assert job_gpu(text, UTIL, 86, "0") == pytest.approx(0.6, abs=0.05)
    assert "from another boot" in agent.log()
    assert "off the wall clock" not in agent.log()  # the new boot's clock recognised


# ------------------------------------------- issue 18, fault 5: a clock step back


def test_a_driver_clock_that_steps_back_resumes_busy_time_within_one_poll(rig: Rig) -> None:
    """Samples on the wall clock, which NTP steps back an hour while the GPU runs."""
    real0 = time.time()
    state = NvmlState(device_clock="epoch", devices=[Device(0, processes=[
        Process(8701, GIB, sm=Pattern.constant(50), start_time=real0 - 5)])])  # fmt: skip
    rig.fake.write(state)
    rig.node.add_job(87, [8701], job_gpus="0", start_time=real0)
    agent = rig.start()
    try:
        agent.wait_metrics(lambda t: (job_gpu(t, BUSY, 87, "0") or 0) > 0.2, timeout=10,
                           what="busy time")
        state.clock_offset_s = -3600.0  # the running GPU's clock goes back an hour
        rig.fake.write(state)
        stepped = agent.metrics()
        wait_samples(agent, 1)  # the poll that finds the cursor ahead of the clock
        text = wait_samples(agent, 3)
    finally:
        agent.stop()
    elapsed = last_sample(text) - last_sample(stepped)
    gained = busy_of(text, 87) - busy_of(stepped, 87)
    # Half busy; at most the poll that re-bases and one poll's window are not counted.
    assert gained >= 0.5 * (elapsed - 2.5), (gained, elapsed, agent.log())
    assert agent.log().count("clock went back") == 2  # device and process samples, once
