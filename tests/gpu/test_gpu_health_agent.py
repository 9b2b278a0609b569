"""What slowed a job's GPU and what hit it: the real agent over a synthetic node and the
fake NVML (violation counters, Xid events, PCIe replays), across a restart.

The fake's clock runs 10x: violation counters are NVML nanoseconds, so each sample
period of the agent (1 real s) is 10 NVML-s of throttling. GPU 0 is power-capped 40 %
of the time while job 21 holds it, then thermally slowed all of the time while job 23
holds it; job 22 holds GPU 1, which has no violation counters at all. Job 24 holds GPU 2,
thermally slowed all of the time, whose driver lacks nvmlDeviceGetViolationStatus (NVML
13 deprecates it): its current clocks-event reasons are sampled instead.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from slurm_gpu_exporter.sim.synthnode import SynthNode
from tests.fakenvml import Device, NvmlState, Process, XidEvent, fake_nvml_or_skip
from tests.gpu.test_gpu_attribution import Rig, labelsets, last_sample, value

pytestmark = pytest.mark.fakenvml

SCALE = 10.0
PERIOD = SCALE * 1.0  # NVML seconds per agent sample (--sample-interval 1)
THROTTLED = "slurm_job_gpu_throttled_seconds_total"
DEVICE_THROTTLED = "slurm_gpu_throttled_seconds_total"
XID = "slurm_job_gpu_xid_errors_total"


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(SynthNode(tmp_path / "node"), fake_nvml_or_skip(tmp_path / "nvml"), tmp_path)


def throttled(text: str, jobid: int, reason: str) -> float | None:
    return value(text, THROTTLED, jobid=str(jobid), reason=reason)


def test_throttled_time_and_errors_go_to_the_job_holding_the_gpu_across_a_restart(
    rig: Rig,
) -> None:
    real0 = time.time()
    links = {0: (0, 0, 0, 0), 1: (0, 0, 0, 0)}
    devices = [Device(0, processes=[Process(4242, 1 << 30)], pcie_replays=0,
                      throttle={"power": 0.4, "thermal": 0.0}, nvlink_errors=dict(links)),
               Device(1, processes=[Process(4343, 1 << 30)]),
               # Nor the NVLink totals' fields: its links are read one by one.
               Device(2, processes=[Process(4545, 1 << 30)], throttle={"thermal": 1.0},
                      nvlink_errors=dict(links),
                      errors={"nvmlDeviceGetViolationStatus": "FUNCTION_NOT_FOUND",
                              "nvmlDeviceGetFieldValues": "FUNCTION_NOT_FOUND"})]
    state = NvmlState(time_scale=SCALE, time_origin=real0, devices=devices)
    rig.fake.write(state)
    job21 = rig.node.add_job(21, [4242], job_gpus="0", start_time=real0)
    rig.node.add_job(22, [4343], job_gpus="1", start_time=real0)
    rig.node.add_job(24, [4545], job_gpus="2", start_time=real0)

    def nvml(real: float) -> float:
        return real0 + SCALE * (real - real0)

    agent = rig.start()
    try:
        text_a = agent.wait_metrics(lambda t: throttled(t, 21, "power") is not None,
                          what="job 21's throttled time")
        text_b = agent.wait_metrics(lambda t: last_sample(t) >= last_sample(text_a) + 5,
                          what="five more samples")
        # 1. 40 % of the NVML time between the two samples, within one sample period.
        span = nvml(last_sample(text_b)) - nvml(last_sample(text_a))
        got = throttled(text_b, 21, "power") - throttled(text_a, 21, "power")
        print(f"\njob 21 power-capped {got:.1f} NVML-s of {span:.1f} (truth {0.4 * span:.1f})")
        assert got == pytest.approx(0.4 * span, abs=0.4 * PERIOD)
        device = [value(t, DEVICE_THROTTLED, gpu="0", reason="power") for t in (text_a, text_b)]
        assert device[1] - device[0] == pytest.approx(got)  # job 21 alone held GPU 0
        assert throttled(text_b, 21, "thermal") == 0.0  # supported, never active
        reasons = {lab["reason"] for lab in labelsets(text_b, THROTTLED) if lab["jobid"] == "21"}
        assert reasons == {"power", "thermal"}  # the others unsupported: no series
        # Sampled where there are no violation counters: the whole span on the agent's
        # clock (real seconds: the fake's scale does not apply), within a sample period.
        sampled = throttled(text_b, 24, "thermal") - throttled(text_a, 24, "thermal")
        assert sampled == pytest.approx(last_sample(text_b) - last_sample(text_a), abs=1.0)
        assert {lab["reason"] for lab in labelsets(text_b, THROTTLED)
                if lab["jobid"] == "24"} == {"thermal", "app_clocks"}
        assert not [lab for lab in labelsets(text_b, THROTTLED) if lab["jobid"] == "22"]

        # 2. An Xid, PCIe replays and NVLink CRC errors on GPU 0 while job 21 holds it:
        # job 21's alone; NVLink replays on GPU 2 (read link by link): job 24's.
        devices[0].xid_events = [XidEvent(1, 79)]
        devices[0].pcie_replays = 3
        devices[0].nvlink_errors = {0: (0, 0, 2, 0), 1: (0, 0, 5, 1)}
        devices[2].nvlink_errors = {0: (4, 0, 0, 0), 1: (0, 0, 0, 0)}
        rig.fake.write(state)

        def nvlink(text: str, jobid: int, kind: str) -> float | None:
            return value(text, "slurm_job_gpu_nvlink_errors_total", jobid=str(jobid), kind=kind)

        text_c = agent.wait_metrics(lambda t: value(t, XID, jobid="21", xid="79") == 1
                          and value(t, "slurm_job_gpu_pcie_replays_total", jobid="21") == 3
                          and nvlink(t, 21, "crc_flit") == 7 and nvlink(t, 24, "replay") == 4,
                          what="job 21's Xid, replays and NVLink errors, job 24's")
        assert nvlink(text_c, 21, "crc_data") == 1 and nvlink(text_c, 21, "replay") == 0
        assert nvlink(text_c, 22, "crc_flit") is None  # GPU 1 has no NVLink
        assert [lab["jobid"] for lab in labelsets(text_c, XID)] == ["21"]
        seen = value(text_c, "slurm_job_gpu_xid_last_timestamp_seconds", jobid="21", xid="79")
        assert seen is not None and real0 <= seen <= time.time()

        # 3. Job 21 ends, job 23 takes GPU 0, now thermally slowed all of the time.
        ended_at = time.time()
        job21.end_time = ended_at
        rig.node.write_record(job21)
        rig.node.remove_job(21)
        devices[0].processes = [Process(4444, 1 << 30)]
        devices[0].throttle = {"power": 0.0, "thermal": 1.0}
        rig.fake.write(state)
        rig.node.add_job(23, [4444], job_gpus="0", start_time=ended_at)
        text_d = agent.wait_metrics(lambda t: (throttled(t, 23, "thermal") or 0) > 2 * PERIOD,
                          what="job 23's thermal time")
        assert value(text_d, XID, jobid="23", xid="79") is None  # before its time
        assert throttled(text_d, 21, "thermal") == pytest.approx(0.0, abs=PERIOD)
        before = throttled(text_d, 23, "thermal")
    finally:
        agent.stop()
    time.sleep(2.0)  # 20 NVML-s down, all of them thermally slowed
    agent = rig.start(name="agent2")
    try:
        text_e = agent.wait_metrics(lambda t: (throttled(t, 23, "thermal") or 0) > before,
                          what="job 23's thermal time after the restart")
        # Job 23 held the GPU all along, slowed all of the time: the time down counts
        # (from the reading saved in the state dir), once.
        held = nvml(last_sample(text_e)) - nvml(last_sample(text_d))
        assert throttled(text_e, 23, "thermal") - before == pytest.approx(held, abs=PERIOD)
        assert value(text_e, XID, jobid="21", xid="79") == 1  # kept, not counted again
    finally:
        agent.stop()
