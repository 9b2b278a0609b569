"""A MIG-enabled GPU through the GPU sampler in process: each instance's jobs get the
time they hold it, their processes and memory, the energy of the instance's share of
the SMs, the parent's errors, and GPM only where their GPU instance has one compute
instance; the parent keeps its device series, without busy time (NVML has none per
instance)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu_exporter.exposition.snapshot import GpuSample, JobGpuSample
from slurm_gpu_exporter.gpu.readings import (
    DeviceReading,
    GpmFigures,
    GpuProcess,
    MigInstance,
)
from slurm_gpu_exporter.gpu.source import GpuPartResult, GpuSampler
from slurm_gpu_exporter.jobs.job import Job
from slurm_gpu_exporter.node.source_health import SourceErrors
from tests.gpu.fake_gpu import T0, FakeBackend, StubMapper

GIB = 2**30
OUTSIDE_PID = 4_999_999  # above any pid_max: /proc has no user for it


class MigBackend(FakeBackend):
    """An A100 split into a 3g and a 1g GPU instance, and a 2g one holding two 1c compute
    instances; 700 W. GPM figures from the second read on (the first only starts them).
    Processes: job 7's on the 3g, job 8's and one outside every job on the 1g, one
    outside every job on the second compute instance of the 2g."""

    def __init__(self) -> None:
        super().__init__()
        self.uuid = "GPU-p"
        self.name = "NVIDIA A100-SXM4-40GB"
        self.ecc_corrected = 0
        self.reads = 0

    def read(self, cursors: dict[str, tuple[int, int]]) -> list[DeviceReading]:
        self.reads += 1
        gpm = self.reads > 1

        def figures(sm: float, pcie: float) -> GpmFigures | None:
            return GpmFigures(10.0, {"sm_active": sm}, {"pcie_transmit": pcie}) if gpm else None

        mig = (MigInstance(1, 0, "MIG-a", "MIG 3g.20gb", 20 * GIB, 1 * GIB, figures(0.5, 100.0)),
               MigInstance(2, 0, "MIG-b", "MIG 1g.5gb", 5 * GIB, 2 * GIB, figures(0.25, 0.0)),
               MigInstance(3, 0, "MIG-c", "MIG 1c.2g.10gb", 10 * GIB, 0, figures(0.1, 0.0)),
               MigInstance(3, 1, "MIG-d", "MIG 1c.2g.10gb", 10 * GIB, GIB // 2,
                           figures(0.1, 0.0)))
        processes = (GpuProcess(100, 1 * GIB, 1, 0), GpuProcess(200, 2 * GIB, 2, 0),
                     GpuProcess(OUTSIDE_PID + 1, GIB // 4, 2, 0),
                     GpuProcess(OUTSIDE_PID, GIB // 2, 3, 1))
        return [DeviceReading(
            index=0, uuid=self.uuid, name=self.name, minor=0, pci_bus_id="", memory_used=3 * GIB,
            memory_total=40 * GIB, energy_mj=self.energy_mj, processes=processes,
            util_samples=None, process_samples=None, mig=mig, gpm_supported=True,
            ecc_corrected=self.ecc_corrected)]


def job(jobid: str, mig: str) -> Job:
    return Job(jobid=jobid, uid=1000, user="alice", cuda_visible_devices=mig,
               start_time=T0 - 60.0)


JOBS = [job("7", "MIG-a"), job("8", "MIG-b"), job("9", "MIG-c")]


@pytest.fixture
def mig() -> Iterator[tuple[MigBackend, GpuSampler]]:
    backend = MigBackend()
    sampler = GpuSampler(backend, Path("/nonexistent-proc"), SourceErrors())
    sampler.mapper = StubMapper({100: "7", 200: "8"})  # type: ignore[assignment]
    yield backend, sampler
    sampler.close()


def two_polls(backend: MigBackend, sampler: GpuSampler) -> GpuPartResult:
    """A first poll at T0, then one 10 s later: 7 kJ used, 2 corrected ECC errors."""
    sampler.sample(JOBS, backend.t)
    backend.advance(10.0, watts=700.0)
    backend.ecc_corrected = 2
    return sampler.sample(JOBS, backend.t)


def of_job(part: GpuPartResult, jobid: str) -> JobGpuSample:
    [found] = [s for s in part.job_gpus if s.jobid == jobid]
    return found


def device(part: GpuPartResult, uuid: str) -> GpuSample:
    [found] = [g for g in part.gpus if g.uuid == uuid]
    return found


def test_each_instance_job_gets_its_time_processes_memory_and_share_of_the_energy(
        mig: tuple[MigBackend, GpuSampler]) -> None:
    part = two_polls(*mig)
    a, b, c = of_job(part, "7"), of_job(part, "8"), of_job(part, "9")
    assert [(s.gpu, s.uuid) for s in (a, b, c)] == [("0.1", "MIG-a"), ("0.2", "MIG-b"),
                                                    ("0.3", "MIG-c")]
    assert [s.allocated_seconds for s in (a, b, c)] == [10.0, 10.0, 10.0]
    # 7 kJ: 3/7 to the 3g instance, 1/7 to each 1-slice one (MIG-d's part to nobody)
    assert [s.energy_joules for s in (a, b, c)] == [
        pytest.approx(3000.0), pytest.approx(1000.0), pytest.approx(1000.0)]
    assert [(s.processes, s.memory_used_bytes, s.memory_peak_bytes) for s in (a, b, c)] == [
        (1, GIB, GIB), (1, 2 * GIB, 2 * GIB), (0, 0, 0)]
    # no busy time per instance: neither busy, unknown nor utilization
    assert {(s.busy_seconds, s.unknown_seconds, s.utilization) for s in (a, b, c)} == {
        (None, None, None)}
    # the parent's corrected ECC errors hit every job on one of its instances
    assert [dict(s.health).get("ecc:corrected") for s in (a, b, c)] == [2.0, 2.0, 2.0]


def test_gpm_goes_to_a_job_only_where_its_gpu_instance_has_one_compute_instance(
        mig: tuple[MigBackend, GpuSampler]) -> None:
    part = two_polls(*mig)
    assert of_job(part, "7").activity_seconds == (("sm_active", 5.0),)
    assert of_job(part, "8").activity_seconds == ()  # a process outside every job on it
    assert of_job(part, "9").activity_seconds == ()  # MIG-c shares GPU instance 3
    assert device(part, "MIG-b").activity_seconds == (("sm_active", 2.5),)
    # every instance keeps its own totals
    assert device(part, "MIG-a").activity_seconds == (("sm_active", 5.0),)
    assert device(part, "MIG-a").traffic_bytes == (("pcie_transmit", 1000.0),)
    assert device(part, "MIG-c").activity_seconds == (("sm_active", 1.0),)


def test_each_instance_has_its_series_and_the_parent_keeps_its_own(
        mig: tuple[MigBackend, GpuSampler]) -> None:
    part = two_polls(*mig)
    assert [g.uuid for g in part.gpus] == ["MIG-a", "MIG-b", "MIG-c", "MIG-d", "GPU-p"]
    d = device(part, "MIG-d")
    assert (d.gpu, d.parent_uuid, d.name, d.minor, d.pci_bus_id) == (
        "0.3", "GPU-p", "MIG 1c.2g.10gb", None, "")
    assert (d.memory_used_bytes, d.memory_total_bytes) == (GIB // 2, 10 * GIB)
    assert (d.unattributed_processes, d.unattributed_memory_bytes) == (1, GIB // 2)
    b = device(part, "MIG-b")
    assert (b.unattributed_processes, b.unattributed_memory_bytes) == (1, GIB // 4)
    a = device(part, "MIG-a")
    assert (a.gpu, a.parent_uuid, a.unattributed_processes, a.unattributed_memory_bytes) == (
        "0.1", "GPU-p", 0, 0)
    parent = device(part, "GPU-p")
    assert (parent.gpu, parent.parent_uuid, parent.name) == ("0", "", "NVIDIA A100-SXM4-40GB")
    assert (parent.busy_seconds, parent.unknown_seconds, parent.utilization) == (
        None, None, None)
    assert parent.energy_joules == pytest.approx(12_000.0)  # the driver's counter: 5 + 7 kJ
    assert parent.memory_used_bytes == 3 * GIB and parent.memory_total_bytes == 40 * GIB
    assert parent.unattributed_processes == 0  # counted on the instance


def test_processes_outside_every_job_on_an_instance_are_their_users(
        mig: tuple[MigBackend, GpuSampler]) -> None:
    part = two_polls(*mig)
    assert [(u.gpu, u.uuid, u.user, u.processes, u.memory_bytes, u.busy_seconds)
            for u in part.unattributed] == [("0.2", "MIG-b", "unknown", 1, GIB // 4, None),
                                            ("0.3", "MIG-d", "unknown", 1, GIB // 2, None)]


def test_the_parent_energy_reading_is_kept_while_a_job_holds_an_instance(
        mig: tuple[MigBackend, GpuSampler]) -> None:
    backend, sampler = mig
    two_polls(backend, sampler)
    saved = sampler.export_state()["energy_readings"]["gpus"]
    assert saved == {"GPU-p": [12_000_000, T0 + 10.0]}
    backend.advance(10.0)
    sampler.sample([], backend.t)  # no job holds any instance now
    assert sampler.export_state()["energy_readings"]["gpus"] == {}


def test_after_a_restart_the_energy_and_errors_of_the_gap_go_to_the_jobs_held_across_it(
        mig: tuple[MigBackend, GpuSampler]) -> None:
    backend, sampler = mig
    two_polls(backend, sampler)
    saved = sampler.export_state()
    backend.advance(30.0, watts=700.0)  # down 30 s: 21 kJ, 3 more corrected ECC errors
    backend.ecc_corrected = 5
    again = GpuSampler(backend, Path("/nonexistent-proc"), SourceErrors())
    again.mapper = StubMapper({100: "7", 200: "8"})  # type: ignore[assignment]
    try:
        again.import_state(saved)
        # job 8 was requeued while the agent was down: a new run, not there before the gap
        jobs = [JOBS[0], Job(jobid="8", uid=1000, user="alice", cuda_visible_devices="MIG-b",
                             start_time=backend.t - 5.0), JOBS[2]]
        part = again.sample(jobs, backend.t)
    finally:
        again.close()
    a, b, c = of_job(part, "7"), of_job(part, "8"), of_job(part, "9")
    # 3/7 and 1/7 of the gap's 21 kJ on top of what they had; none to the new run
    assert a.energy_joules == pytest.approx(3000.0 + 9000.0)
    assert c.energy_joules == pytest.approx(1000.0 + 3000.0)
    assert b.energy_joules == 0.0
    assert a.allocated_seconds == pytest.approx(40.0)
    assert [dict(s.health).get("ecc:corrected") for s in (a, b, c)] == [5.0, 0.0, 5.0]
