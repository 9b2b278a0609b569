"""The whole exposition of a fixed snapshot, compared with checked-in files.

Any change to a family name, help text, label, value format or order shows up as a
diff of tests/exposition/golden/. When the change is meant, regenerate the files and review
the diff: ``UPDATE_GOLDEN=1 .venv/bin/pytest tests/exposition/test_golden_exposition.py``.
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

import pytest

from slurm_gpu_exporter import __version__
from slurm_gpu_exporter.exposition.rendered import render
from slurm_gpu_exporter.exposition.snapshot import (
    CpuEnergySample,
    GpuSample,
    JobCpuEnergySample,
    JobGpuSample,
    JobInfo,
    JobSample,
    NodeIdentity,
    Snapshot,
    SourceStatus,
    StepTiming,
    UnattributedSample,
)
from slurm_gpu_exporter.node.source_health import SOURCES

GOLDEN = Path(__file__).resolve().parent / "golden"
# The agent's own process figures (RSS, CPU, open files) change from run to run.
_PROCESS_LINE = re.compile(r"^(# (HELP|TYPE|UNIT) )?process_")


def fixed_snapshot() -> Snapshot:
    """Two jobs (one running on a GPU and a MIG instance, one lingering), two devices,
    an unattributed user and every self metric (the node info too); throttling and
    errors on the first GPU."""
    running = JobInfo(jobid="4101", user="alice", uid=1001, account="ml", partition="gpu",
                      qos="normal", name="train \"big\" \\ net", array_job_id="4100",
                      array_task_id="1", start_time=1_700_000_000.0)
    ended = JobInfo(jobid="4102", user="bob", uid=1002, account="physics", partition="gpu",
                    name="sweep", start_time=1_700_000_100.0, end_time=1_700_000_400.5,
                    source="cgroup")
    return Snapshot(
        timestamp=1_700_000_500.25,
        jobs=(
            JobSample(job=running, gpus=2, cpus=8, cpu_seconds=1234.5,
                      memory_used_bytes=8 << 30, memory_limit_bytes=32 << 30,
                      memory_peak_bytes=9 << 30, oom_kills=0, processes=5),
            JobSample(job=ended, gpus=1, cpu_seconds=99.0, memory_peak_bytes=1 << 30,
                      memory_used_bytes=0, processes=0),
        ),
        job_gpus=(
            JobGpuSample(job=JobInfo(jobid="4101", user="alice"), gpu="0", uuid="GPU-aaaa",
                         allocated_seconds=500.0,
                         busy_seconds=412.75, utilization=0.8125, memory_used_bytes=20 << 30,
                         memory_peak_bytes=22 << 30, energy_joules=150_000.5, processes=2,
                         activity_seconds=(("dram_active", 88.5), ("sm_active", 250.25),
                                           ("sm_occupancy", 120.0), ("tensor_active", 60.5)),
                         health=(("ecc:corrected", 1.0), ("nvlink:crc_flit", 2.0),
                                 ("pcie_replays", 0.0), ("remapped_rows:correctable", 1.0),
                                 ("throttle:power", 42.5), ("throttle:thermal", 0.0),
                                 ("xid:79", 1.0)),
                         xid_last_seen=((79, 1_700_000_300.0),)),
            JobGpuSample(job=JobInfo(jobid="4101", user="alice"), gpu="1.3", uuid="MIG-bbbb",
                         allocated_seconds=500.0, busy_seconds=None, utilization=None,
                         memory_used_bytes=1 << 30, memory_peak_bytes=2 << 30,
                         energy_joules=None, processes=1, activity_seconds=(("sm_active", 12.5),),
                         health=(("throttle:power", 7.25),)),
            JobGpuSample(job=JobInfo(jobid="4102", user="bob"), gpu="2", uuid="GPU-cccc",
                         allocated_seconds=300.5,
                         busy_seconds=0.0, utilization=0.0, memory_used_bytes=0,
                         memory_peak_bytes=0, energy_joules=12_000.0, processes=0),
        ),
        gpus=(
            GpuSample(gpu="0", uuid="GPU-aaaa", name="NVIDIA H100 80GB HBM3", minor=0,
                      pci_bus_id="00000000:1B:00.0", utilization=0.9, busy_seconds=9000.5,
                      memory_used_bytes=21 << 30, memory_total_bytes=80 << 30, power_watts=350.25,
                      energy_joules=3_000_000.0, temperature_celsius=61.0, ecc_corrected=3,
                      ecc_uncorrected=0, xid_errors=((79, 1), (13, 2)),
                      unattributed_processes=1, unattributed_memory_bytes=512 << 20,
                      activity_seconds=(("fp64_active", 1.5), ("sm_active", 5000.75)),
                      traffic_bytes=(("nvlink_receive", 0.0), ("pcie_transmit", 1.25e12)),
                      throttled_seconds=(("power", 1234.5), ("thermal", 0.0)),
                      sm_clock_hz=1.755e9, sm_clock_max_hz=1.98e9,
                      error_counters=(("nvlink:crc_flit", 2), ("pcie_replays", 5),
                                      ("remapped_rows:correctable", 1),
                                      ("remapped_rows:uncorrectable", 0))),
            GpuSample(gpu="1.3", uuid="MIG-bbbb", name="NVIDIA A100 MIG 1g.10gb", minor=None,
                      pci_bus_id="00000000:3B:00.0", parent_uuid="GPU-dddd",
                      memory_used_bytes=1 << 30, memory_total_bytes=10 << 30,
                      activity_seconds=(("sm_active", 40.0),)),
            GpuSample(gpu="2", uuid="GPU-cccc", name="NVIDIA H100 80GB HBM3", minor=2,
                      pci_bus_id="00000000:5B:00.0", lost=True),
        ),
        unattributed=(
            UnattributedSample(gpu="0", uuid="GPU-aaaa", user="carol", processes=1,
                               memory_bytes=512 << 20, busy_seconds=12.5),
        ),
        nvml_up=True,
        sources=tuple(SourceStatus(s, s != "slurm") for s in SOURCES),
        steps=(StepTiming("registry", 0.0012), StepTiming("cgroup", 0.0034),
               StepTiming("nvml", 0.0101), StepTiming("state", 0.0005)),
        errors=dict.fromkeys(SOURCES, 0) | {"slurm": 3, "spool": 1},
        sample_duration_seconds=0.0152,
        powercap_up=True,
        job_cpu_energy=(
            JobCpuEnergySample(job=JobInfo(jobid="4101", user="alice"), domain="package",
                               joules=5400.5),
            JobCpuEnergySample(job=JobInfo(jobid="4101", user="alice"), domain="dram",
                               joules=610.25),
        ),
        cpu_energy=(CpuEnergySample("0", "package", 90_000.0), CpuEnergySample("0", "dram", 9000.0),
                    CpuEnergySample("1", "package", 70_000.5)),
        cpu_energy_outside_jobs=(("dram", 8389.75), ("package", 154_600.0)),
        identity=NodeIdentity("gpu-node-07", "c1"),
    )


def _stable(exposition: bytes) -> str:
    """The exposition without what depends on the machine: process figures, versions."""
    lines = [line for line in exposition.decode().splitlines()
             if not _PROCESS_LINE.match(line)]
    text = "\n".join(lines) + "\n"
    return (text.replace(f'version="{__version__}"', 'version="VERSION"')
            .replace(f'python_version="{platform.python_version()}"',
                     'python_version="PYTHON_VERSION"'))


@pytest.mark.parametrize(("name", "field"), [("exposition.txt", "text"),
                                              ("exposition.openmetrics.txt", "openmetrics")])
def test_fixed_snapshot_renders_as_the_golden_file(name: str, field: str) -> None:
    rendered = _stable(getattr(render(fixed_snapshot()), field))
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(rendered)
    assert path.exists(), f"{path} is missing; create it with UPDATE_GOLDEN=1"
    assert rendered == path.read_text(), (
        f"the exposition differs from {path}; if the change is meant, regenerate it with "
        "UPDATE_GOLDEN=1 and review the diff")
