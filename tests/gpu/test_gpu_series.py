"""The series a whole GPU and its jobs get from the GPU sampler, in process, on figures
worked out by hand: the device's own readings, use by processes outside every job,
jobs without processes, a finished job, two GPUs in label order, a GPU that is lost
and one without utilization samples."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu_exporter.exposition.snapshot import JobGpuSample
from slurm_gpu_exporter.gpu.readings import DeviceReading, GpuProcess
from slurm_gpu_exporter.gpu.source import GpuPartResult, GpuSampler
from slurm_gpu_exporter.jobs.job import Job
from slurm_gpu_exporter.node.source_health import SourceErrors
from tests.gpu.fake_gpu import T0, FakeBackend, StubMapper

GIB = 2**30
OUTSIDE_PID = 4_999_999  # above any pid_max: /proc has no user for it


class RichBackend(FakeBackend):
    """The one-GPU fake with the device readings it leaves out, a second GPU on demand
    (index 1, a UUID that sorts first), a lost GPU or one without utilization samples."""

    def __init__(self) -> None:
        super().__init__()
        self.two = False
        self.lost = False
        self.no_utilization = False

    def read(self, cursors: dict[str, tuple[int, int]]) -> list[DeviceReading]:
        [r] = super().read(cursors)
        r = dataclasses.replace(r, power_watts=250.0, memory_used=3 * GIB,
                                memory_total=80 * GIB, temperature_c=61.0, ecc_uncorrected=3)
        if self.lost:
            r = dataclasses.replace(r, lost=True, util_samples=None, processes=(),
                                    energy_mj=None)
        if self.no_utilization:
            r = dataclasses.replace(r, util_samples=None)
        if self.two:
            return [r, dataclasses.replace(r, index=1, uuid="GPU-0000", minor=1)]
        return [r]


@pytest.fixture
def gpu(tmp_path: Path) -> Iterator[tuple[RichBackend, GpuSampler]]:
    backend = RichBackend()
    sampler = GpuSampler(backend, tmp_path, SourceErrors())
    sampler.mapper = StubMapper({100: "7"})  # type: ignore[assignment]
    yield backend, sampler
    sampler.close()


def job(jobid: str = "7", gpus: str = "0", end: float | None = None) -> Job:
    return Job(jobid=jobid, uid=1000, user="alice", job_gpus=gpus, start_time=T0 - 60.0,
               end_time=end)


def polls(backend: RichBackend, sampler: GpuSampler, jobs: list[Job], n: int = 2,
          seconds: float = 10.0) -> GpuPartResult:
    """A first poll at the backend's time, then ``n - 1`` more ``seconds`` apart (100 W)."""
    part = sampler.sample(jobs, backend.t)
    for _ in range(n - 1):
        backend.advance(seconds)
        part = sampler.sample(jobs, backend.t)
    return part


def of_job(part: GpuPartResult, jobid: str = "7") -> list[JobGpuSample]:
    return [s for s in part.job_gpus if s.jobid == jobid]


def test_the_device_series_carry_the_readings_and_the_use_outside_every_job(
        gpu: tuple[RichBackend, GpuSampler]) -> None:
    backend, sampler = gpu
    backend.processes = (GpuProcess(100, 1 * GIB), GpuProcess(OUTSIDE_PID, GIB // 2))
    backend.sm_active = 0.4
    part = polls(backend, sampler, [job()])
    [device] = part.gpus
    assert (device.gpu, device.uuid, device.name, device.minor, device.lost) == (
        "0", "GPU-aaaa", "fake", 0, False)
    assert (device.power_watts, device.memory_used_bytes, device.memory_total_bytes,
            device.temperature_celsius, device.ecc_uncorrected) == (
        250.0, 3 * GIB, 80 * GIB, 61.0, 3)
    # 10 s at 50 %: 5 busy seconds, none lost; the counter 5 kJ + 10 s at 100 W
    assert device.busy_seconds == pytest.approx(5.0) and device.unknown_seconds == 0.0
    assert device.utilization == pytest.approx(0.5)
    assert device.energy_joules == pytest.approx(6000.0)
    assert (device.unattributed_processes, device.unattributed_memory_bytes) == (1, GIB // 2)
    assert device.driver_events == ()
    # no process samples to weigh by: the job and the outside user split the busy time
    [u] = part.unattributed
    assert (u.gpu, u.uuid, u.user, u.processes, u.memory_bytes) == (
        "0", "GPU-aaaa", "unknown", 1, GIB // 2)
    assert u.busy_seconds == pytest.approx(2.5)
    [s] = of_job(part)
    assert s.busy_seconds == pytest.approx(2.5) and s.energy_joules == pytest.approx(500.0)
    assert (s.uuid, s.gpu, s.processes, s.memory_used_bytes) == ("GPU-aaaa", "0", 1, GIB)
    # GPM is the whole GPU's: with a process outside every job on it, the job gets none
    assert s.activity_seconds == ()
    assert device.activity_seconds == (("sm_active", pytest.approx(4.0)),)


def test_a_job_alone_on_its_gpu_gets_its_gpm_activity(
        gpu: tuple[RichBackend, GpuSampler]) -> None:
    backend, sampler = gpu
    backend.processes = (GpuProcess(100, 1 * GIB),)
    backend.sm_active = 0.4
    [s] = of_job(polls(backend, sampler, [job()]))
    assert s.activity_seconds == (("sm_active", pytest.approx(4.0)),)
    assert s.busy_seconds == pytest.approx(5.0)


def test_samples_clamped_to_100_percent_are_counted_as_driver_events(
        gpu: tuple[RichBackend, GpuSampler]) -> None:
    backend, sampler = gpu
    backend.percent = 150.0
    part = polls(backend, sampler, [job()])
    assert part.gpus[0].busy_seconds == pytest.approx(10.0)
    kinds = dict(part.gpus[0].driver_events)
    assert list(kinds) == ["clamped"] and kinds["clamped"] >= 100


def test_a_job_holding_a_gpu_without_processes_has_none_and_no_memory(
        gpu: tuple[RichBackend, GpuSampler]) -> None:
    backend, sampler = gpu
    [s] = of_job(polls(backend, sampler, [job()]))
    assert (s.processes, s.memory_used_bytes, s.memory_peak_bytes) == (0, 0, 0)
    assert s.allocated_seconds == pytest.approx(10.0) and s.busy_seconds == pytest.approx(5.0)
    assert s.utilization == pytest.approx(0.5) and s.unknown_seconds == 0.0


def test_a_finished_job_keeps_its_totals_and_loses_its_gauges(
        gpu: tuple[RichBackend, GpuSampler]) -> None:
    backend, sampler = gpu
    backend.processes = (GpuProcess(100, 1 * GIB),)
    polls(backend, sampler, [job()])
    backend.advance(10.0)
    [s] = of_job(sampler.sample([job(end=backend.t)], backend.t))
    assert (s.processes, s.memory_used_bytes, s.utilization) == (0, 0, None)
    assert s.memory_peak_bytes == GIB and s.busy_seconds == pytest.approx(5.0)
    assert s.allocated_seconds == pytest.approx(10.0)


def test_a_jobs_gpus_come_in_the_order_of_their_labels(
        gpu: tuple[RichBackend, GpuSampler]) -> None:
    backend, sampler = gpu
    backend.two = True
    part = polls(backend, sampler, [job(gpus="0,1")])
    assert [(s.gpu, s.uuid) for s in of_job(part)] == [("0", "GPU-aaaa"), ("1", "GPU-0000")]
    assert [g.uuid for g in part.gpus] == ["GPU-aaaa", "GPU-0000"]


def test_a_lost_gpu_stays_allocated_to_its_job_with_no_busy_time_or_use(
        gpu: tuple[RichBackend, GpuSampler]) -> None:
    backend, sampler = gpu
    backend.processes = (GpuProcess(100, 1 * GIB),)
    polls(backend, sampler, [job()])
    backend.lost = True
    backend.advance(10.0)
    part = sampler.sample([job()], backend.t)
    [s] = of_job(part)
    assert s.allocated_seconds == pytest.approx(20.0)
    assert s.busy_seconds == pytest.approx(5.0)  # what was measured before it was lost
    assert (s.utilization, s.memory_used_bytes, s.processes) == (None, 0, 0)
    assert s.memory_peak_bytes == GIB
    [device] = part.gpus
    assert device.lost and device.busy_seconds is None and device.utilization is None


def test_a_gpu_lost_before_it_had_a_uuid_is_nobodys(
        gpu: tuple[RichBackend, GpuSampler]) -> None:
    backend, sampler = gpu
    backend.lost = True
    backend.uuid = ""
    part = polls(backend, sampler, [job()])
    assert of_job(part) == [] and part.gpus[0].lost


def test_a_gpu_without_utilization_samples_is_held_but_never_busy(
        gpu: tuple[RichBackend, GpuSampler]) -> None:
    backend, sampler = gpu
    backend.no_utilization = True
    backend.processes = (GpuProcess(100, 1 * GIB),)
    part = polls(backend, sampler, [job()], n=3)
    [s] = of_job(part)
    assert s.allocated_seconds == pytest.approx(20.0)
    assert (s.busy_seconds, s.unknown_seconds, s.utilization) == (None, None, None)
    assert s.energy_joules == pytest.approx(2000.0)  # idle: the energy is the holder's
    assert (part.gpus[0].busy_seconds, part.gpus[0].unknown_seconds) == (None, None)
