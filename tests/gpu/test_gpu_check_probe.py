"""``scripts/gpu-check --probe`` against the fake NVML: the JSON it writes tells the
driver's habits as the fake's real-driver defaults have them (tests/fakenvml/README.md)."""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.fakenvml import Device, NvmlState, Pattern, Process, fake_nvml_or_skip
from tests.support import REPO

pytestmark = [pytest.mark.process, pytest.mark.fakenvml]


# The buffer is a ring of 120 slots of samples taken 167 ms apart: 119 periods from
# oldest to newest, and one more for each sample missing between them (the fake leaves
# out about one in 7, never two in a row: 17 or so in 136 periods; 40 is past anything
# its hash gives over such a run), each end up to 0.3 of a period late (its jitter).
PERIOD_S = 0.167  # the fake's sample_period_ms
SLOTS = 120  # the fake's buffer_samples
SPAN_MIN_S = (SLOTS - 1 - 0.3) * PERIOD_S
SPAN_MAX_S = (SLOTS - 1 + 40 + 0.3) * PERIOD_S


def test_probe_records_clocks_spacing_idle_samples_process_reads_energy_and_gpm(
    tmp_path: Path,
) -> None:
    fake = fake_nvml_or_skip(tmp_path / "nvml")
    now = time.time()
    fake.write(NvmlState(devices=[
        # pid 100's samples are current, pid 109's 4.5 s late (the default stagger).
        Device(0, power_w=60.0, gpm={"sm_util": 40.0}, throttle={"power": 0.5},
               pcie_replays=2, processes=[
            Process(100, sm=Pattern.constant(30), start_time=now - 30),
            Process(109, sm=Pattern.constant(20), start_time=now - 30)]),
        Device(1),  # idle: its buffer runs dry
    ]))  # fmt: skip
    out = tmp_path / "probe.json"
    for gpu in ("0", "1"):
        run = subprocess.run(
            [str(REPO / "scripts" / "gpu-check"), "--probe", "--gpu", gpu, "--out",
             str(out.with_suffix(f".{gpu}.json")), "--probe-seconds", "1", "--probe-busy", "1"],
            env=fake.env(), capture_output=True, text=True, timeout=90, check=False)
        assert run.returncode == 0, run.stdout + run.stderr
    busy = json.loads(out.with_suffix(".0.json").read_text())
    idle = json.loads(out.with_suffix(".1.json").read_text())
    assert busy["driver"] == "550.54.15" and busy["probe_version"] == 3

    [gpu] = busy["gpus"]
    if ctypes.util.find_library("cuda") is None:  # no CUDA beside the fake: said why
        assert gpu["load"].startswith("not run: ") and "libcuda.so.1" in gpu["load"]
    device = gpu["before_load"]["device_samples"]
    assert device["clock"] == "boottime"
    assert device["spacing_s"]["median"] == pytest.approx(0.167, abs=0.02)
    assert SPAN_MIN_S <= device["buffer_span_s"] <= SPAN_MAX_S
    assert device["buffer_samples"] == SLOTS  # busy for 30 s: the ring is full
    process = gpu["before_load"]["process_samples"]
    assert process["clock"] == "realtime"
    assert process["samples_per_process_per_read"]["max"] == 1
    assert process["age_s"]["max"] >= 4.0  # pid 109's, 4.5 s late
    energy = gpu["energy_before_load"]
    assert energy["seconds_between_changes"]["median"] == pytest.approx(0.1, abs=0.03)
    assert energy["step_mj"]["median"] == pytest.approx(6000, rel=0.05)  # 60 W x 100 ms
    assert gpu["gpm"]["supported"] is True and gpu["gpm"]["call"] == "NVML_SUCCESS"
    assert gpu["gpm"]["metrics"]["sm_util"] == {"return": "NVML_SUCCESS", "value": 40.0}

    # The whole buffer, busy for 30 s: 120 samples of 1/6 s (missing ones take no slot,
    # as on drivers), stamped the same when read again.
    full = gpu["full_buffer"]
    assert full["under_load"] is (ctypes.util.find_library("cuda") is not None)
    assert SPAN_MIN_S <= full["span_s"] <= SPAN_MAX_S
    assert full["period_s"] == pytest.approx(0.167, abs=0.02)
    assert full["samples"] == SLOTS and full["restamped_on_reread"] == 0

    # Throttling: the power counter grew half of the time, in ns, its reference time in
    # µs of the epoch; the policies the fake does not list answer NOT_SUPPORTED.
    health = gpu["health"]
    power = health["violations"]["power"]
    assert power["grew_ns_per_host_s"] == pytest.approx(0.5e9, rel=0.2)
    assert power["reference_per_host_s"] == pytest.approx(1e6, rel=0.05)
    assert abs(power["reference_behind_s"]["realtime"]) < 1.0
    assert health["violations"]["thermal"] == {"error": "NVML_ERROR_NOT_SUPPORTED"}
    assert health["pcie_replays"] == 2 and health["sm_clock_max_mhz"] == 1410
    assert health["remapped_rows"] == {"error": "NVML_ERROR_NOT_SUPPORTED"}
    assert health["nvlink"] == {"0": {"error": "NVML_ERROR_NOT_SUPPORTED"}}
    assert health["nvlink_total_fields"] == {k: {"error": 3} for k in
                                             ("replay", "recovery", "crc_flit", "crc_data")}
    assert health["mig"] is None
    assert health["call_us"]["violation"] > 0 and health["call_us"]["active_nvlinks"] == 0

    [dry] = idle["gpus"]
    assert dry["full_buffer"] == {"under_load": False, "read": "NVML_ERROR_NOT_FOUND",
                                  "samples": 0}
    assert dry["before_load"]["device_samples"]["samples"] == 0
    assert dry["before_load"]["device_samples"]["errors"] == {
        "NVML_ERROR_NOT_FOUND": dry["before_load"]["device_samples"]["reads"]}
    assert dry["gpm"] == {"supported": False}
