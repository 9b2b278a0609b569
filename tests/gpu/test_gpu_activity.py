"""GPM activity: the pure arithmetic, and the GPU sampler over the small fake backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu_exporter.gpu.attribution.activity import DeviceActivity, job_activity, sole_job
from slurm_gpu_exporter.gpu.attribution.counters import JobGpuCounters
from slurm_gpu_exporter.gpu.readings import GpmFigures, GpuProcess
from slurm_gpu_exporter.gpu.source import GpuPartResult, GpuSampler
from slurm_gpu_exporter.jobs.job import Job
from slurm_gpu_exporter.node.source_health import SourceErrors
from tests.gpu.fake_gpu import T0, FakeBackend, StubMapper

# ------------------------------------------------------------- pure parts


def test_activity_goes_to_a_job_only_when_it_has_the_target_to_itself() -> None:
    assert sole_job({"7"}, outside=False) == "7"
    assert sole_job({"7", "8"}, outside=False) is None  # shared: GPM cannot split it
    assert sole_job({"7"}, outside=True) is None  # a process outside every job is on it
    assert sole_job(set(), outside=False) is None


def test_job_activity_is_fraction_times_interval_trimmed_to_the_jobs_start() -> None:
    figures = GpmFigures(10.0, {"sm_active": 0.25, "tensor_active": 0.5}, {})
    assert job_activity(figures, start=0.0, now=100.0) == {"sm_active": 2.5, "tensor_active": 5.0}
    assert job_activity(figures, start=96.0, now=100.0) == {"sm_active": 1.0, "tensor_active": 2.0}
    assert job_activity(figures, start=None, now=100.0)["sm_active"] == 2.5
    assert job_activity(figures, start=120.0, now=100.0)["sm_active"] == 0.0


def test_device_totals_add_up_survive_the_state_dir_and_skip_missing_figures() -> None:
    totals = DeviceActivity()
    totals.add("GPU-a", GpmFigures(2.0, {"sm_active": 0.5}, {"pcie_receive": 100.0}))
    totals.add("GPU-a", None)  # a failed read: nothing added, nothing reset
    totals.add("GPU-a", GpmFigures(1.0, {"sm_active": 1.0}, {"pcie_receive": 50.0}))
    assert totals.of("GPU-a") == ((("sm_active", 2.0),), (("pcie_receive", 250.0),))
    assert totals.of("GPU-b") == ((), ())
    again = DeviceActivity()
    again.import_state(totals.export_state())
    assert again.of("GPU-a") == totals.of("GPU-a")
    again.import_state({"gpm_activity": ["junk"], "gpm_traffic": {"GPU-c": {"x": "y"}}})
    assert again.of("GPU-c") == ((), ())
    again.prune({"GPU-b"})
    assert again.of("GPU-a") == ((), ())


def test_job_counters_keep_activity_in_the_state_and_read_the_older_format() -> None:
    c = JobGpuCounters(gpu="0", held=10.0, window=10.0, busy=5.0)
    c.add_activity({"sm_active": 2.5})
    c.add_activity({"sm_active": 0.5, "dram_active": 1.0})
    back = JobGpuCounters.from_state(c.to_state())
    assert back is not None and back.activity == {"sm_active": 3.0, "dram_active": 1.0}
    older = JobGpuCounters.from_state(["0", 10.0, 10.0, 5.0, None, 0, 100.0])
    assert older is not None and older.activity == {}
    assert JobGpuCounters.from_state(["0", 1.0, 1.0, None, None, 0, None, ["bad"]]) is None


# ------------------------------------------------ the sampler, fake backend


@pytest.fixture
def backend() -> FakeBackend:
    b = FakeBackend()
    b.sm_active = 0.25
    return b


@pytest.fixture
def sampler(backend: FakeBackend, tmp_path: Path) -> Iterator[GpuSampler]:
    s = GpuSampler(backend, tmp_path, SourceErrors())
    s.mapper = StubMapper({4242: "7", 4343: "8"})  # type: ignore[assignment]
    yield s
    s.close()


def job(jobid: str = "7", start: float = T0 - 60.0) -> Job:
    return Job(jobid=jobid, uid=1000, user="alice", job_gpus="0", start_time=start)


def run(sampler: GpuSampler, backend: FakeBackend, jobs: list[Job], polls: int,
        step: float = 1.0) -> GpuPartResult:  # fmt: skip
    part = sampler.sample(jobs, backend.t)
    for _ in range(polls):
        backend.advance(step)
        part = sampler.sample(jobs, backend.t)
    return part


def activity(part: GpuPartResult, jobid: str = "7") -> dict[str, float]:
    [found] = [s for s in part.job_gpus if s.jobid == jobid]
    return dict(found.activity_seconds)


def test_whole_gpu_job_gets_sm_active_whose_ratio_to_allocated_is_its_mean(
    sampler: GpuSampler, backend: FakeBackend,
) -> None:
    backend.processes = (GpuProcess(4242, 1 << 30),)
    part = run(sampler, backend, [job()], polls=60)
    [js] = part.job_gpus
    assert dict(js.activity_seconds)["sm_active"] / js.allocated_seconds == pytest.approx(0.25)
    [gpu] = part.gpus
    assert dict(gpu.activity_seconds)["sm_active"] == pytest.approx(15.0)
    assert dict(gpu.traffic_bytes)["pcie_transmit"] == pytest.approx(60_000.0)


def test_gpu_shared_by_two_jobs_gets_device_activity_only(
    sampler: GpuSampler, backend: FakeBackend,
) -> None:
    backend.processes = (GpuProcess(4242, 1 << 30), GpuProcess(4343, 1 << 30))
    part = run(sampler, backend, [job("7"), job("8")], polls=5)
    assert activity(part, "7") == {} and activity(part, "8") == {}
    assert dict(part.gpus[0].activity_seconds)["sm_active"] == pytest.approx(1.25)


def test_gpu_without_gpm_has_no_activity_anywhere(sampler: GpuSampler,
                                                  backend: FakeBackend) -> None:
    backend.sm_active = None
    backend.processes = (GpuProcess(4242, 1 << 30),)
    part = run(sampler, backend, [job()], polls=3)
    assert activity(part) == {}
    assert part.gpus[0].activity_seconds == () and part.gpus[0].traffic_bytes == ()
    assert part.job_gpus[0].busy_seconds == pytest.approx(1.5)  # the rest is as before


def test_failed_gpm_read_neither_resets_nor_loses_activity(
    sampler: GpuSampler, backend: FakeBackend,
) -> None:
    backend.processes = (GpuProcess(4242, 1 << 30),)
    before = activity(run(sampler, backend, [job()], polls=3))["sm_active"]
    backend.advance(1.0)
    backend.fail = {"gpm"}
    during = activity(sampler.sample([job()], backend.t))["sm_active"]
    after = activity(run(sampler, backend, [job()], polls=1))["sm_active"]
    assert during == before == pytest.approx(0.75)
    assert after == pytest.approx(1.25)  # the failed interval is counted with the next


def test_job_that_starts_within_an_interval_gets_only_the_part_since_its_start(
    sampler: GpuSampler, backend: FakeBackend,
) -> None:
    run(sampler, backend, [], polls=1, step=10.0)
    backend.processes = (GpuProcess(4242, 1 << 30),)
    backend.advance(10.0)
    late = job(start=backend.t - 4.0)
    part = sampler.sample([late], backend.t)
    assert activity(part)["sm_active"] == pytest.approx(1.0)  # 0.25 x 4 s, not x 10 s
    assert dict(part.gpus[0].activity_seconds)["sm_active"] == pytest.approx(5.0)


def test_activity_counters_survive_a_restart(backend: FakeBackend, tmp_path: Path) -> None:
    backend.processes = (GpuProcess(4242, 1 << 30),)
    first = GpuSampler(backend, tmp_path, SourceErrors())
    first.mapper = StubMapper({4242: "7"})  # type: ignore[assignment]
    try:
        run(first, backend, [job()], polls=4)
        saved = first.export_state()
    finally:
        first.close()
    second = GpuSampler(FakeBackend(), tmp_path, SourceErrors())
    second.mapper = StubMapper({4242: "7"})  # type: ignore[assignment]
    try:
        second.import_state(saved)
        part = second.sample([job()], backend.t + 1.0)
    finally:
        second.close()
    assert activity(part)["sm_active"] == pytest.approx(1.0)
