"""The GPU sampler in process, over a small fake backend whose clock the test drives.

The backend is one GPU (minor 0) with driver samples every 100 ms at ``percent``
and a cumulative energy counter; the tests step its clock, call ``sample`` with
the same wall time, and read the job-GPU samples the agent would export.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu_exporter.exposition.snapshot import JobGpuSample
from slurm_gpu_exporter.gpu.attribution.counters import load_job_counters
from slurm_gpu_exporter.gpu.backend import GpuUnavailable
from slurm_gpu_exporter.gpu.driver.integration import held_seconds
from slurm_gpu_exporter.gpu.readings import GpuProcess
from slurm_gpu_exporter.gpu.source import GpuPartResult, GpuSampler
from slurm_gpu_exporter.jobs.job import Job
from slurm_gpu_exporter.node.source_health import SourceErrors
from tests.gpu.fake_gpu import T0, FakeBackend, StubMapper


@pytest.fixture
def sampler(backend: FakeBackend, tmp_path: Path) -> Iterator[GpuSampler]:
    s = GpuSampler(backend, tmp_path, SourceErrors())
    s.mapper = StubMapper({})  # type: ignore[assignment]
    yield s
    s.close()


def job(jobid: str = "7", start: float = T0 - 60.0, gpus: str = "0") -> Job:
    return Job(jobid=jobid, uid=1000, user="alice", job_gpus=gpus, start_time=start)


def poll(sampler: GpuSampler, backend: FakeBackend, jobs: list[Job]) -> GpuPartResult:
    return sampler.sample(jobs, backend.t)


def polls_a_second_apart(sampler: GpuSampler, backend: FakeBackend, jobs: list[Job],
                         n: int) -> None:
    poll(sampler, backend, jobs)
    for _ in range(n - 1):
        backend.advance(1.0)
        poll(sampler, backend, jobs)


def one(part: GpuPartResult, jobid: str = "7") -> JobGpuSample:
    [found] = [s for s in part.job_gpus if s.jobid == jobid]
    return found


# ------------------------------------------------------------- pure parts


def test_held_seconds_count_from_the_last_count_or_the_start_not_before_the_first_poll() -> None:
    assert held_seconds(None, 100.0, 50.0, 130.0) == 30.0  # from the job's start
    assert held_seconds(None, 10.0, 50.0, 130.0) == 80.0  # not before the agent's first poll
    assert held_seconds(120.0, 10.0, 50.0, 130.0) == 10.0  # since the last count
    assert held_seconds(None, 200.0, 50.0, 130.0) == 0.0  # never negative


@pytest.mark.parametrize("data", [
    {"counters": ["not", "a", "map"]}, {"job_counters": {"7": 1}},
    {"job_counters": [["7", "yesterday", {}], ["8", 1.0, {"GPU-a": ["0", "x"]}], 5]},
    {"counters": {"7": {"GPU-a": None}}},
])
def test_unreadable_saved_counters_are_left_out_without_an_error(data: dict) -> None:
    assert load_job_counters(data) == {}


# ------------------------------------------- 3. transient errors: no reset


def test_one_failed_energy_read_keeps_the_total_and_counts_the_missed_energy(
    sampler: GpuSampler, backend: FakeBackend,
) -> None:
    jobs = [job()]
    poll(sampler, backend, jobs)  # first look: the driver's counter is the baseline
    seen = []
    for fail in (False, True, False):
        backend.advance(1.0, watts=10.0)  # 10 J a second
        if fail:
            backend.fail = {"energy"}
        part = poll(sampler, backend, jobs)
        seen.append(one(part).energy_joules)
        device_energy = part.gpus[0].energy_joules
        assert device_energy is not None  # the device series stays too
        saved = sampler.export_state()["job_counters"]
        assert None not in [c[4] for _, _, per in saved for c in per.values()]
    assert seen == [pytest.approx(10.0), pytest.approx(10.0), pytest.approx(30.0)]


def test_energy_is_absent_only_where_the_gpu_does_not_support_it(
    sampler: GpuSampler, backend: FakeBackend,
) -> None:
    backend.energy_mj = None  # NOT_SUPPORTED: no value and no failure
    jobs = [job()]
    for _ in range(3):
        backend.advance(1.0)
        part = poll(sampler, backend, jobs)
    assert one(part).energy_joules is None
    assert part.gpus[0].energy_joules is None
    assert one(part).busy_seconds is not None


def test_one_failed_sample_read_keeps_busy_time_and_loses_none(
    sampler: GpuSampler, backend: FakeBackend,
) -> None:
    jobs = [job()]
    poll(sampler, backend, jobs)
    busy = []
    for fail in (False, True, False):
        backend.advance(1.0)
        if fail:
            backend.fail = {"utilization samples"}
        busy.append(one(poll(sampler, backend, jobs)).busy_seconds)
    assert busy == [pytest.approx(0.5), pytest.approx(0.5), pytest.approx(1.5)]


# -------------------------------------------- 4. allocated time is wall time


def test_idle_gpu_whose_driver_has_no_samples_is_allocated_for_the_time_held(
    sampler: GpuSampler, backend: FakeBackend,
) -> None:
    backend.no_samples = True
    poll(sampler, backend, [])
    jobs = [job(start=T0 + 0.25)]  # starts after the agent's first poll
    for _ in range(10):
        backend.advance(1.0)
        part = poll(sampler, backend, jobs)
    assert one(part).allocated_seconds == pytest.approx(9.75)
    assert one(part).busy_seconds == 0.0


def test_a_held_gpu_whose_buffer_is_dry_from_the_start_reads_zero_utilization(
    sampler: GpuSampler, backend: FakeBackend,
) -> None:
    backend.no_samples = True  # an idle GPU: its driver takes no samples
    jobs = [job()]
    poll(sampler, backend, jobs)
    for _ in range(2):
        backend.advance(1.0)
        got = one(poll(sampler, backend, jobs))
    assert got.utilization == 0.0 and got.busy_seconds == 0.0


def test_allocated_time_includes_a_gap_in_the_samples_busy_time_does_not(
    sampler: GpuSampler, backend: FakeBackend,
) -> None:
    backend.percent = 100.0
    jobs = [job()]
    polls_a_second_apart(sampler, backend, jobs, 4)
    backend.advance(5.0)
    backend.lost_before = backend.t - 1.0  # the driver lost 4 s of samples
    got = one(poll(sampler, backend, jobs))
    assert got.allocated_seconds == pytest.approx(8.0)
    # 3 s before the gap; the gap is idle (no samples), the first sample past it
    # covers one period, then 0.9 s after it.
    assert got.busy_seconds == pytest.approx(4.0)


def test_allocated_time_goes_on_while_the_driver_is_stuck(
    sampler: GpuSampler, backend: FakeBackend, monkeypatch: pytest.MonkeyPatch,
) -> None:
    jobs = [job()]
    poll(sampler, backend, jobs)
    backend.advance(1.0)
    before = one(poll(sampler, backend, jobs)).allocated_seconds
    assert sampler.link._poller is not None
    monkeypatch.setattr(sampler.link._poller, "poll", lambda cursors, timeout: None)  # hung read
    backend.advance(4.0)
    part = poll(sampler, backend, jobs)
    assert not part.nvml_up
    assert one(part).allocated_seconds == pytest.approx(before + 4.0)


def test_a_slow_read_over_an_idle_gpu_loses_no_time(
    sampler: GpuSampler, backend: FakeBackend, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One read still running at the next sample (a loaded node, a slow driver) over a GPU
    that idles between two bursts: the driver's buffer held everything, so the idle gap is
    idle time, not unknown. Before, the slow read marked the gap up to the next burst
    unknown: 4.1 s of the slow poll's 5 s here."""
    backend.percent = 100.0
    jobs = [job()]
    polls_a_second_apart(sampler, backend, jobs, 4)
    backend.no_samples = True  # idle: the driver takes no samples
    assert sampler.link._poller is not None
    real = sampler.link._poller.poll
    for i in range(6):
        backend.advance(1.0)
        if i == 2:
            monkeypatch.setattr(sampler.link._poller, "poll", lambda cursors, timeout: None)
        poll(sampler, backend, jobs)
        monkeypatch.setattr(sampler.link._poller, "poll", real)
    backend.no_samples, backend.lost_before = False, backend.t + 4.0  # busy from then on
    backend.advance(5.0)  # a late poll: 1 s of samples after 4 s more idle
    got = one(poll(sampler, backend, jobs))
    assert got.unknown_seconds == 0.0
    assert got.allocated_seconds == pytest.approx(14.0)
    assert got.busy_seconds == pytest.approx(4.0)


# ------------------------------------------------------- 5. clock domains


def test_only_a_jobs_first_window_is_trimmed_to_its_start(
    sampler: GpuSampler, backend: FakeBackend,
) -> None:
    backend.clock_offset_s = -30.0  # the driver's clock lags the wall clock (within tolerance)
    poll(sampler, backend, [])
    backend.advance(1.0)
    jobs = [job(start=backend.t - 0.45)]
    first = one(poll(sampler, backend, jobs))
    assert first.busy_seconds == 0.0  # its window lies before its start on the wall clock
    for _ in range(3):
        backend.advance(1.0)
        later = one(poll(sampler, backend, jobs))
    assert later.busy_seconds == pytest.approx(1.5)


def test_first_window_trim_leaves_out_the_time_before_the_start(
    sampler: GpuSampler, backend: FakeBackend,
) -> None:
    poll(sampler, backend, [])
    backend.advance(1.0)
    jobs = [job(start=backend.t - 0.45)]
    assert one(poll(sampler, backend, jobs)).busy_seconds == pytest.approx(0.225)


def test_driver_timestamps_on_another_clock_are_counted_and_logged_once(
    sampler: GpuSampler, backend: FakeBackend, caplog: pytest.LogCaptureFixture,
) -> None:
    backend.clock_offset_s = -1.7e9  # e.g. stamped by a clock that starts at boot
    jobs = [job(start=T0 + 0.5)]
    caplog.set_level(logging.WARNING)
    poll(sampler, backend, jobs)
    for _ in range(4):
        backend.advance(1.0)
        got = one(poll(sampler, backend, jobs))
    assert got.busy_seconds == pytest.approx(2.0)
    warnings = [r for r in caplog.records if "off the wall clock" in r.getMessage()]
    assert len(warnings) == 1


# ------------------------------------------------------------ 6. requeue


def test_requeued_job_starts_fresh_gpu_counters(sampler: GpuSampler,
                                                backend: FakeBackend) -> None:
    first_run = [job(start=T0)]
    poll(sampler, backend, first_run)
    for _ in range(5):
        backend.advance(1.0)
        old = one(poll(sampler, backend, first_run))
    assert old.busy_seconds == pytest.approx(2.5)
    backend.advance(1.0)
    second_run = [job(start=backend.t - 0.5)]  # same id, requeued onto this node
    for _ in range(2):
        backend.advance(1.0)
        new = one(poll(sampler, backend, second_run))
    assert new.allocated_seconds == pytest.approx(2.5)
    assert new.busy_seconds == pytest.approx(1.25)
    saved = sampler.export_state()["job_counters"]
    assert [(jobid, start) for jobid, start, _ in saved] == [("7", backend.t - 2.5)]


def test_saved_counters_are_read_back_by_job_run_and_from_the_old_format(
    backend: FakeBackend, tmp_path: Path,
) -> None:
    jobs = [job()]
    old_format = {"counters": {"7": {backend.uuid: ["0", 100.0, 40.0, 900.0, 0]}}}
    states: list[dict] = [old_format]  # then what the first agent saved
    for saved in states:
        s = GpuSampler(backend, tmp_path, SourceErrors())
        s.mapper = StubMapper({})  # type: ignore[assignment]
        try:
            s.import_state(saved)
            poll(s, backend, jobs)
            backend.advance(1.0)
            got = one(poll(s, backend, jobs))
            assert got.allocated_seconds >= 101.0
            assert got.busy_seconds == pytest.approx(40.5 if saved is old_format else 41.0)
            assert got.energy_joules is not None and got.energy_joules > 900.0
            if len(states) == 1:
                states.append(s.export_state())
            # A requeued run of the same id does not inherit the saved run's counters.
            requeued = [job(start=backend.t)]
            assert one(poll(s, backend, requeued)).allocated_seconds == 0.0
        finally:
            s.close()


# ------------------------------------------------------------- 9. pruning


def test_caches_of_a_gpu_never_seen_again_are_dropped(sampler: GpuSampler,
                                                      backend: FakeBackend) -> None:
    for _ in range(2):
        backend.advance(1.0)
        poll(sampler, backend, [job()])
    old = backend.uuid
    backend.uuid = "GPU-bbbb"  # the GPU was replaced (or a MIG layout changed)
    for _ in range(2):
        backend.advance(1.0)
        poll(sampler, backend, [job()])
    state = sampler.export_state()
    assert list(state["sample_cursors"]["gpus"]) == ["GPU-bbbb"]
    assert list(state["device_busy"]) == ["GPU-bbbb"]
    assert old not in sampler.energy.last
    # The job's counters on the old GPU stay with it while the job runs ...
    [(_, _, per)] = state["job_counters"]
    assert set(per) == {old, "GPU-bbbb"}
    # ... and go with the job.
    backend.advance(1.0)
    poll(sampler, backend, [])
    assert sampler.export_state()["job_counters"] == []


# ------------------------------------------------- 11. unattributed busy


def test_busy_time_of_processes_outside_every_job_is_counted_by_user(
    sampler: GpuSampler, backend: FakeBackend, tmp_path: Path,
) -> None:
    for pid, uid in ((900, 0), (901, 65534)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\n")
    backend.processes = (GpuProcess(900, 1 << 20), GpuProcess(901, 1 << 20))
    backend.percent = 80.0
    poll(sampler, backend, [])
    for _ in range(3):
        backend.advance(1.0)
        part = poll(sampler, backend, [])
    busy = {u.user: u.busy_seconds for u in part.unattributed}
    assert part.gpus[0].busy_seconds == pytest.approx(2.4)
    # No process samples to weigh them by: split evenly.
    assert busy == {"root": pytest.approx(1.2), "nobody": pytest.approx(1.2)}


# ------------------------------------------------------- injected clock


def test_nvml_comes_back_after_reinit_after_on_the_injected_clock(
    backend: FakeBackend, tmp_path: Path,
) -> None:
    monotonic = [100.0]
    s = GpuSampler(backend, tmp_path, SourceErrors(), reinit_after=60.0,
                   clock=lambda: monotonic[0])
    s.mapper = StubMapper({})  # type: ignore[assignment]
    try:
        backend.init_error = GpuUnavailable("no driver yet")
        assert not poll(s, backend, [job()]).nvml_up
        backend.init_error = None
        monotonic[0] += 59.0
        assert not poll(s, backend, [job()]).nvml_up  # no retry before reinit_after
        monotonic[0] += 1.0
        assert poll(s, backend, [job()]).nvml_up
        assert backend.inits == 2
    finally:
        s.close()
