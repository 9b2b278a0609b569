"""The job report's values on small jobs worked out by hand: a running job without
accounting, a job with NVML GPM activity, and what the JSON says of each."""

from __future__ import annotations

import json

from slurm_gpu_exporter.report.figures.shapes import (
    Accounting,
    GpuDetail,
    JobDetail,
    JobUsage,
    NodeDetail,
)
from slurm_gpu_exporter.report.render.text import job_json
from slurm_gpu_exporter.report.render.values import job_header, job_summary

H = 3600.0
NOW = 1_796_025_600.0  # 2026-11-30 08:00 UTC


def _running_job(**usage: float) -> JobDetail:
    """Job 7, 2 GPUs for 2 hours so far, one of them with GPM; no accounting, no end."""
    job = JobUsage("7", user="ann", gpus=2, allocated_s=4 * H, busy_s=1 * H,
                   start=NOW - 2 * H, **usage)  # type: ignore[arg-type]
    gpus = [GpuDetail("0", "GPU-a", 2 * H, 1 * H), GpuDetail("1", "GPU-b", 2 * H, 0.0)]
    return JobDetail(job, [NodeDetail("n1", gpus=gpus)], None, now=NOW)


def test_a_running_job_without_accounting_is_running_in_progress() -> None:
    detail = _running_job()
    header = dict(job_header(detail))
    assert header["State"] == "RUNNING (in progress)"
    assert header["Run time"] == "2h00m" and header["Time limit"] == "-"
    assert header["Account"] == "-" and header["Partition"] == "-"
    (job,) = json.loads(job_json([detail], queries=3))["jobs"]
    assert job["state"] == "RUNNING" and job["running"] is True and job["end"] is None
    assert job["run_time_s"] == 7200.0 and job["time_limit_s"] is None


def test_the_summary_shows_sm_tensor_and_dram_activity_over_the_gpm_hours() -> None:
    # GPM on one GPU for 2 hours: SMs active 1 h (50 %), tensor 0.5 h, DRAM 0.2 h
    detail = _running_job(gpm_allocated_s=2 * H, sm_active_s=1 * H,
                          tensor_active_s=0.5 * H, dram_active_s=0.2 * H)
    lines = job_summary(detail)
    labels = [label for label, _ in lines]
    summary = dict(lines)
    assert summary["GPU busy"] == "25.0% over 4.00 GPU-hours"
    assert summary["GPU SM active"] == "50.0% over 2.00 GPU-hours with GPM"
    assert summary["GPU tensor active"] == "25.0%"
    assert summary["GPU DRAM active"] == "10.0%"
    assert labels.index("GPU busy") < labels.index("GPU SM active") < labels.index(
        "GPU tensor active") < labels.index("GPU DRAM active")
    (job,) = json.loads(job_json([detail], queries=1))["jobs"]
    assert (job["sm_active_ratio"], job["tensor_active_ratio"], job["dram_active_ratio"]) == (
        0.5, 0.25, 0.1)


def test_a_job_without_gpm_has_no_activity_lines() -> None:
    labels = [label for label, _ in job_summary(_running_job())]
    assert not [label for label in labels if "active" in label]


def test_a_job_with_sm_activity_alone_has_no_tensor_or_dram_line() -> None:
    summary = dict(job_summary(_running_job(gpm_allocated_s=2 * H, sm_active_s=0.5 * H)))
    assert summary["GPU SM active"] == "25.0% over 2.00 GPU-hours with GPM"
    assert "GPU tensor active" not in summary and "GPU DRAM active" not in summary


def _ended_job(*, cpu_energy_j: float | None = None, energy_j: float | None = None,
               unknown_s: float = 0.0, allocated_s: float = 2 * H,
               accounting: Accounting | None = None) -> JobDetail:
    """Job 9, one GPU, ended an hour before NOW."""
    job = JobUsage("9", user="ben", gpus=1, allocated_s=allocated_s, busy_s=allocated_s / 2,
                   start=NOW - 3 * H, end=NOW - 1 * H, unknown_s=unknown_s)
    gpu = GpuDetail("0", "GPU-c", allocated_s, allocated_s / 2, energy_j=energy_j)
    node = NodeDetail("n2", cpus=4, gpus=[gpu], cpu_energy_j=cpu_energy_j)
    return JobDetail(job, [node], accounting, now=NOW)


def test_cpu_and_dram_energy_is_shown_in_kwh_with_its_caveat() -> None:
    detail = _ended_job(cpu_energy_j=1.8e6, energy_j=7.2e6)  # 0.5 kWh and 2 kWh
    summary = dict(job_summary(detail))
    assert summary["CPU and DRAM energy"] == "0.500 kWh (share by CPU time, an estimate)"
    assert summary["GPU energy"] == "2.000 kWh"
    (job,) = json.loads(job_json([detail], queries=1))["jobs"]
    assert job["cpu_energy_kwh"] == 0.5 and job["energy_kwh"] == 2.0
    # 7.2 MJ over the 2 GPU-hours held: 1000 W
    assert job["gpu_power_mean_w"] == 1000.0


def test_a_job_without_energy_readings_shows_dashes_and_nulls() -> None:
    detail = _ended_job()
    summary = dict(job_summary(detail))
    assert summary["GPU energy"] == "-" and "CPU and DRAM energy" not in summary
    (job,) = json.loads(job_json([detail], queries=1))["jobs"]
    assert job["cpu_energy_kwh"] is None and job["energy_kwh"] is None
    assert job["gpu_power_mean_w"] is None


def test_mean_power_counts_the_unmeasured_time_held_even_under_a_second() -> None:
    # held 0.5 s, none of it measured: 100 J over 0.5 s
    detail = _ended_job(energy_j=100.0, allocated_s=0.0, unknown_s=0.5)
    (job,) = json.loads(job_json([detail], queries=1))["jobs"]
    assert job["gpu_power_mean_w"] == 200.0
    assert job["unmeasured_gpu_hours"] == 0.5 / 3600


def test_unmeasured_gpu_time_is_shown_in_gpu_hours_from_36_seconds() -> None:
    summary = dict(job_summary(_ended_job(unknown_s=100 * H)))
    assert summary["GPU time unmeasured"] == (
        "100.00 GPU-hours (the driver's samples may have been lost: neither busy nor idle)")
    assert "GPU time unmeasured" in dict(job_summary(_ended_job(unknown_s=36.0)))
    assert "GPU time unmeasured" not in dict(job_summary(_ended_job(unknown_s=35.9)))


def test_a_time_limit_of_zero_or_none_is_a_dash() -> None:
    for limit in (0.0, None):
        header = dict(job_header(_ended_job(accounting=Accounting("COMPLETED", limit))))
        assert header["Time limit"] == "-" and header["State"] == "COMPLETED"
    header = dict(job_header(_ended_job(accounting=Accounting("TIMEOUT", 90 * 60.0))))
    assert header["Time limit"] == "1h30m" and header["Run time"] == "2h00m"
