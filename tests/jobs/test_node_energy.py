"""Node power from synthetic hwmon trees, integrated and shared among jobs by what their
GPUs and CPUs used."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_gpu_exporter.exposition.rendered import render
from slurm_gpu_exporter.exposition.snapshot import (
    CpuEnergySample,
    GpuSample,
    JobCpuEnergySample,
    JobGpuSample,
    JobInfo,
    Snapshot,
)
from slurm_gpu_exporter.jobs.node_energy import MeasuredParts, NodeEnergySource
from slurm_gpu_exporter.node.hwmon import HwmonPowerMeter, MeterDown, find_power_files
from slurm_gpu_exporter.node.source_health import SourceErrors
from tests.support.agent import series


class HwmonTree:
    """A sysfs-like hwmon tree: an ACPI power meter beside sensors that are not the node."""

    def __init__(self, root: Path, meter: str | None = "hwmon2") -> None:
        self.root = root
        self.device("hwmon0", "k10temp", {"temp1_input": "45000"})
        self.device("hwmon1", "amdgpu", {"power1_average": "35000000"})  # a part: unread
        self.meter = meter
        if meter is not None:
            self.device(meter, "power_meter", {"power1_average": "0", "power1_interval": "1000"})

    def device(self, name: str, driver: str, files: dict[str, str]) -> None:
        d = self.root / name
        d.mkdir(parents=True)
        (d / "name").write_text(driver + "\n")
        for file, value in files.items():
            (d / file).write_text(value + "\n")

    def set_watts(self, watts: float) -> None:
        assert self.meter is not None
        (self.root / self.meter / "power1_average").write_text(f"{round(watts * 1e6)}\n")


def _job(jobid: str) -> JobInfo:
    return JobInfo(jobid=jobid, user="alice", start_time=1000.0)


JOBS = {j: _job(j) for j in ("1", "2", "3")}


class Parts:
    """Counters of the measured parts: two GPUs, one socket, three jobs."""

    def __init__(self) -> None:
        self.job_gpu = {"1": 0.0, "2": 0.0, "3": 0.0}
        self.gpu = {"GPU-a": 0.0, "GPU-b": 0.0}
        self.job_cpu = {"1": 0.0, "2": 0.0, "3": 0.0}
        self.cpu = 0.0

    def measured(self) -> MeasuredParts:
        return MeasuredParts(
            job_gpu=tuple(JobGpuSample(JOBS[j], "0" if j != "3" else "1",
                                       "GPU-a" if j != "3" else "GPU-b", 0.0, None, None,
                                       0, 0, e, 1) for j, e in self.job_gpu.items()),
            gpus=tuple(GpuSample(g, g, "H100", None, "", energy_joules=e)
                       for g, e in self.gpu.items()),
            job_cpu=tuple(JobCpuEnergySample(JOBS[j], "package", e)
                          for j, e in self.job_cpu.items()),
            cpu=(CpuEnergySample("0", "package", self.cpu),))


def _shares(part) -> dict[str, float]:  # type: ignore[no-untyped-def]
    return {s.job.jobid: s.joules for s in part.jobs}


def test_only_the_named_meter_is_read_and_input_wins_over_average(tmp_path: Path) -> None:
    tree = HwmonTree(tmp_path)
    assert find_power_files(tmp_path, ("power_meter",)) == [tmp_path / "hwmon2" /
                                                             "power1_average"]
    tree.set_watts(412.5)
    assert HwmonPowerMeter(tmp_path).read() == pytest.approx(412.5)
    (tmp_path / "hwmon2" / "power1_input").write_text("400000000\n")
    assert HwmonPowerMeter(tmp_path).read() == pytest.approx(400.0)


def test_three_jobs_and_outside_add_up_to_the_metered_energy(tmp_path: Path) -> None:
    tree = HwmonTree(tmp_path)
    errors = SourceErrors()
    source = NodeEnergySource(HwmonPowerMeter(tmp_path), errors)
    parts = Parts()
    running = list(JOBS.values())
    tree.set_watts(900.0)
    assert source.sample(0.0, running, parts.measured()).energy_joules == 0.0
    truth, last_watts = 0.0, 900.0
    for step in range(1, 41):
        watts = 900.0 + 150.0 * (step % 4)  # the meter moves between samples
        tree.set_watts(watts)
        truth += (last_watts + watts) / 2 * 5.0
        last_watts = watts
        # per 5 s: job 1 uses a GPU hard, job 2 shares it lightly, job 3 mostly CPU
        for j, e in (("1", 1500.0), ("2", 250.0 * (step % 3)), ("3", 100.0)):
            parts.job_gpu[j] += e
        parts.gpu["GPU-a"] += 1500.0 + 250.0 * (step % 3) + 100.0  # idle power of no job
        parts.gpu["GPU-b"] += 100.0
        for j, e in (("1", 200.0), ("2", 50.0), ("3", 400.0)):
            parts.job_cpu[j] += e
        parts.cpu += 800.0
        part = source.sample(5.0 * step, running, parts.measured())
    shares = _shares(part)
    assert part.up and errors.snapshot()["nodepower"] == 0
    assert part.energy_joules == pytest.approx(truth, rel=1e-9)
    assert sum(shares.values()) + part.outside_jobs_joules == pytest.approx(truth, rel=0.005)
    assert shares["1"] > shares["3"] > shares["2"] > 0 and part.outside_jobs_joules > 0
    text = render(Snapshot(timestamp=200.0, node_power_up=True,
                           node_power_watts=part.power_watts,
                           node_energy_joules=part.energy_joules, job_node_energy=part.jobs,
                           node_energy_outside_jobs=part.outside_jobs_joules)).text.decode()
    exposed = {labels["jobid"]: v for labels, v in
               series(text, "slurm_job_node_energy_joules_total")}
    node = series(text, "slurm_node_energy_joules_total")[0][1]
    outside = series(text, "slurm_node_outside_jobs_energy_joules_total")[0][1]
    assert sum(exposed.values()) + outside == pytest.approx(node, rel=0.005)


def test_a_node_without_a_meter_is_down_counted_once_and_shows_no_energy(tmp_path: Path
                                                                          ) -> None:
    HwmonTree(tmp_path, meter=None)
    errors = SourceErrors()
    source = NodeEnergySource(HwmonPowerMeter(tmp_path), errors)
    parts = [source.sample(float(t), [], MeasuredParts()) for t in range(150)]
    assert not any(p.up for p in parts)
    assert parts[-1].energy_joules is None and parts[-1].outside_jobs_joules is None
    assert errors.snapshot()["nodepower"] == 1


def test_an_absent_meter_read_again_and_again_keeps_its_error_small(tmp_path: Path) -> None:
    # Raising one stored exception again grows its traceback by a frame per read: an
    # agent on a node without a meter leaked about 6 KiB a sample that way.
    meter = HwmonPowerMeter(tmp_path / "none")
    depths = []
    for _ in range(200):
        with pytest.raises(MeterDown) as caught:
            meter.read()
        tb, depth = caught.value.__traceback__, 0
        while tb is not None:
            tb, depth = tb.tb_next, depth + 1
        depths.append(depth)
    assert max(depths) <= 3, depths[-1]


def test_an_unreadable_meter_is_down_and_its_interval_not_counted(tmp_path: Path) -> None:
    tree = HwmonTree(tmp_path)
    errors = SourceErrors()
    source = NodeEnergySource(HwmonPowerMeter(tmp_path), errors)
    tree.set_watts(500.0)
    source.sample(0.0, [], MeasuredParts())
    assert source.sample(10.0, [], MeasuredParts()).energy_joules == pytest.approx(5000.0)
    # as root a mode does not stop a read; a directory in the file's place does
    path = tmp_path / "hwmon2" / "power1_average"
    os.unlink(path)
    path.mkdir()
    down = source.sample(20.0, [], MeasuredParts())
    assert not down.up and down.power_watts is None
    assert down.energy_joules == pytest.approx(5000.0)  # not zero, not a guess
    assert errors.snapshot()["nodepower"] == 1
    path.rmdir()
    tree.set_watts(500.0)
    source.sample(30.0, [], MeasuredParts())  # the interval from 10 to 30 s is left out
    assert source.sample(40.0, [], MeasuredParts()).energy_joules == pytest.approx(10000.0)


def test_garbage_in_the_meter_file_is_down_not_zero(tmp_path: Path) -> None:
    HwmonTree(tmp_path)
    (tmp_path / "hwmon2" / "power1_average").write_text("n/a\n")
    with pytest.raises(MeterDown, match="cannot read"):
        HwmonPowerMeter(tmp_path).read()


def test_a_meter_that_vanishes_is_found_again_under_its_new_number(tmp_path: Path) -> None:
    tree = HwmonTree(tmp_path)
    errors = SourceErrors()
    source = NodeEnergySource(HwmonPowerMeter(tmp_path), errors)
    tree.set_watts(300.0)
    source.sample(0.0, [], MeasuredParts())
    source.sample(1.0, [], MeasuredParts())
    for f in (tmp_path / "hwmon2").iterdir():
        f.unlink()
    (tmp_path / "hwmon2").rmdir()  # the driver unloaded
    assert not source.sample(2.0, [], MeasuredParts()).up
    tree.meter = "hwmon3"
    tree.device("hwmon3", "power_meter", {"power1_average": "300000000"})  # and reloaded
    back = [source.sample(3.0 + t, [], MeasuredParts()) for t in range(3)]
    assert all(p.up for p in back)
    assert back[-1].energy_joules == pytest.approx(300.0 + 600.0)


def test_counters_survive_a_restart_through_the_state(tmp_path: Path) -> None:
    tree = HwmonTree(tmp_path)
    source = NodeEnergySource(HwmonPowerMeter(tmp_path), SourceErrors())
    parts = Parts()
    tree.set_watts(100.0)
    source.sample(0.0, [JOBS["1"]], parts.measured())
    parts.job_gpu["1"] += 50.0
    parts.gpu["GPU-a"] += 50.0
    source.sample(10.0, [JOBS["1"]], parts.measured())
    state = source.export_state()
    again = NodeEnergySource(HwmonPowerMeter(tmp_path), SourceErrors())
    again.import_state(state)
    part = again.sample(20.0, [JOBS["1"]], parts.measured())  # first read: nothing added
    assert part.energy_joules == pytest.approx(1000.0)
    assert _shares(part) == {"1": pytest.approx(1000.0)}


def test_a_mig_instance_is_not_counted_beside_its_gpu(tmp_path: Path) -> None:
    tree = HwmonTree(tmp_path)
    source = NodeEnergySource(HwmonPowerMeter(tmp_path), SourceErrors())
    tree.set_watts(100.0)

    def parts(joules: float) -> MeasuredParts:
        gpu = GpuSample("0", "GPU-a", "A100", 0, "", energy_joules=2 * joules)
        mig = GpuSample("0.1", "MIG-x", "A100", None, "", parent_uuid="GPU-a",
                        energy_joules=joules)
        job = JobGpuSample(JOBS["1"], "0.1", "MIG-x", 0.0, None, None, 0, 0, joules, 1)
        return MeasuredParts(job_gpu=(job,), gpus=(gpu, mig))

    source.sample(0.0, [JOBS["1"]], parts(0.0))
    part = source.sample(10.0, [JOBS["1"]], parts(300.0))
    # the job's instance used 300 J of the GPU's 600 J: half the node's 1000 J
    assert _shares(part) == {"1": pytest.approx(500.0)}
    assert part.outside_jobs_joules == pytest.approx(500.0)
