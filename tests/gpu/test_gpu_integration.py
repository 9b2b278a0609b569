"""The pure arithmetic of GPU sampling (gpu/driver/integration.py) on plain readings."""

from __future__ import annotations

import logging

import pytest

from slurm_gpu_exporter.gpu.driver.integration import DeviceIntegrator
from slurm_gpu_exporter.gpu.readings import (
    DeviceReading,
    GpuProcess,
    HostClocks,
    ProcessUtilSample,
    UtilSample,
)

AT = HostClocks(realtime=1_800_000_000.0, boottime=1_000.0, monotonic=1_000.0)


def at(boottime: float) -> HostClocks:
    return HostClocks(realtime=1_800_000_000.0 + boottime, boottime=boottime,
                      monotonic=boottime)


def reading(samples: tuple[UtilSample, ...] | None = (), energy_mj: int | None = None,
            failed: frozenset[str] = frozenset(), uuid: str = "GPU-a",
            process_samples: tuple[ProcessUtilSample, ...] | None = (),
            pids: tuple[int, ...] = (), util_newest: int | None = None,
            process_newest: int | None = None) -> DeviceReading:
    return DeviceReading(index=0, uuid=uuid, name="fake", minor=0, pci_bus_id="",
                         energy_mj=energy_mj, util_samples=samples,
                         process_samples=process_samples, failed=failed,
                         processes=tuple(GpuProcess(p, 0) for p in pids),
                         util_buffer_newest_us=util_newest,
                         process_buffer_newest_us=process_newest)


def grid(first_s: float, n: int, percent: float) -> tuple[UtilSample, ...]:
    return tuple(UtilSample(int((first_s + 0.1 * i) * 1e6), percent) for i in range(n))


def test_the_first_look_only_sets_the_cursor_then_each_sample_counts_once() -> None:
    dev = DeviceIntegrator()
    first = dev.integrate(reading(grid(100.0, 5, 50.0)), at(100.5))
    assert (first.window, first.busy) == (0.0, 0.0)
    assert dev.driver_cursors()["GPU-a"] == (100_400_000, 0)
    got = dev.integrate(reading(grid(100.5, 10, 50.0)), at(101.5))
    assert got.window == pytest.approx(1.0) and got.busy == pytest.approx(0.5)
    assert got.clock == "boottime"
    assert dev.device_busy["GPU-a"] == pytest.approx(0.5)


def test_a_gpu_without_samples_has_no_window_and_keeps_its_process_cursor() -> None:
    dev = DeviceIntegrator()
    procs = (ProcessUtilSample(9, 5_000_000, 10.0),)
    got = dev.integrate(reading(None, process_samples=procs, pids=(9,)), AT)
    assert (got.window, got.busy) == (None, None)
    assert dev.driver_cursors()["GPU-a"] == (0, 5_000_000)


def test_a_dry_buffer_counts_idle_time_and_the_next_sample_covers_one_period() -> None:
    dev = DeviceIntegrator()
    dev.integrate(reading(grid(100.0, 5, 100.0)), at(100.4))
    idle = dev.integrate(reading(()), at(105.4))  # no samples for 5 s: the GPU is idle
    assert idle.busy == 0.0 and idle.window == pytest.approx(5.0 - 0.25)
    back = dev.integrate(reading(grid(106.0, 3, 100.0)), at(106.2))
    assert back.busy == pytest.approx(0.1 + 0.2)  # one period, then two spacings
    assert idle.window + back.window == pytest.approx(6.2 - 0.4)


def test_a_failed_sample_read_is_not_taken_for_a_dry_buffer() -> None:
    dev = DeviceIntegrator()
    dev.integrate(reading(grid(100.0, 5, 100.0)), at(100.4))
    failed = dev.integrate(reading((), failed=frozenset({"utilization samples"})), at(103.4))
    assert failed.window == 0.0
    back = dev.integrate(reading(grid(100.5, 30, 100.0)), at(103.4))
    assert back.busy == pytest.approx(3.0)


def test_a_device_cursor_ahead_of_every_sample_the_driver_holds_is_rebased_once_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dev = DeviceIntegrator()
    dev.integrate(reading(grid(5000.0, 5, 100.0)), at(5000.4))
    with caplog.at_level(logging.WARNING):
        # The driver's clock went back an hour: nothing is newer than the cursor.
        dev.integrate(reading((), util_newest=1_400_400_000), at(5001.4))
    assert dev.driver_cursors()["GPU-a"][0] == 1_400_400_000
    assert "clock went back 3600 s" in caplog.text
    got = dev.integrate(reading(grid(1400.5, 10, 100.0)), at(5002.4))
    assert got.busy == pytest.approx(1.0)  # counting resumes at the next poll


def test_process_samples_of_different_ages_each_count_once_against_their_own_cursor() -> None:
    dev = DeviceIntegrator()
    pids = (1, 2)
    first = dev.integrate(reading(None, process_samples=(
        ProcessUtilSample(1, 100_000_000, 30.0), ProcessUtilSample(2, 96_000_000, 50.0)),
        pids=pids), AT)
    assert {s.pid for s in first.process_samples} == {1, 2}
    # The lagging process holds lastSeenTimeStamp back to its own newest sample ...
    assert dev.driver_cursors()["GPU-a"][1] == 96_000_000
    second = dev.integrate(reading(None, process_samples=(
        ProcessUtilSample(1, 100_000_000, 30.0), ProcessUtilSample(1, 101_000_000, 30.0),
        ProcessUtilSample(2, 97_000_000, 50.0)), pids=pids), AT)
    # ... so its next sample, older than the other's newest, is not skipped.
    assert [(s.pid, s.timestamp_us) for s in second.process_samples] == [
        (1, 101_000_000), (2, 97_000_000)]


def test_garbage_process_samples_are_dropped_and_counted() -> None:
    dev = DeviceIntegrator()
    # As reported (nvtop #110): a garbage smUtil comes with a garbage timestamp.
    got = dev.integrate(reading(None, process_samples=(
        ProcessUtilSample(1, 217_144_956_601_725, 37100.0),
        ProcessUtilSample(2, 100_000_000, 50.0)), pids=(1, 2)), AT)
    assert [(s.pid, s.sm_percent) for s in got.process_samples] == [(2, 50.0)]
    assert dev.events.counts["GPU-a"] == {"out_of_range": 1}
    assert dev.cursors["GPU-a"].process_high_us == 100_000_000  # not moved by it


def test_garbage_device_samples_are_dropped_and_counted() -> None:
    dev = DeviceIntegrator()
    dev.integrate(reading(grid(100.0, 5, 50.0)), at(100.5))
    samples = (*grid(100.5, 5, 50.0), UtilSample(101_000_000, 37100.0))
    got = dev.integrate(reading(samples), at(101.5))
    assert got.busy == pytest.approx(0.5 * 0.5)
    assert dev.events.counts["GPU-a"] == {"out_of_range": 1}


def test_a_driver_overshoot_to_130_percent_is_clamped_and_counted() -> None:
    dev = DeviceIntegrator()
    got = dev.integrate(reading(None, process_samples=(
        ProcessUtilSample(1, 100_000_000, 130.0), ProcessUtilSample(2, 100_000_000, 50.0)),
        pids=(1, 2)), AT)
    assert [s.sm_percent for s in got.process_samples] == [100.0, 50.0]
    assert dev.events.counts["GPU-a"] == {"clamped": 1}


def test_a_sample_of_a_pid_no_longer_on_the_gpu_moves_no_cursor() -> None:
    dev = DeviceIntegrator()
    got = dev.integrate(reading(None, process_samples=(
        ProcessUtilSample(1, 100_000_000, 30.0), ProcessUtilSample(7, 900_000_000, 30.0)),
        pids=(1,)), AT)
    assert [s.pid for s in got.process_samples] == [1]
    assert dev.cursors["GPU-a"].process_high_us == 100_000_000


def test_a_dry_reread_a_microsecond_older_is_not_a_clock_step_and_idle_time_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What failed the bursty test on fresh machines: the buffer ran dry after a burst
    # and its re-read newest sample came back 1 µs older than the cursor.
    dev = DeviceIntegrator()
    dev.integrate(reading(grid(100.0, 5, 100.0)), at(100.5))
    dev.integrate(reading(grid(100.5, 5, 100.0)), at(101.0))  # cursor at 100.9 s
    with caplog.at_level(logging.WARNING):
        idle = [dev.integrate(reading((), util_newest=100_899_999), at(101.0 + 2 * i))
                for i in range(1, 6)]
    assert not caplog.records
    assert dev.cursors["GPU-a"].continuous
    assert sum(f.window or 0.0 for f in idle) == pytest.approx(9.75)  # idle, counted
    after = dev.integrate(reading(grid(120.0, 3, 100.0)), at(120.5))
    assert after.unknown == 0.0
    assert dev.events.counts["GPU-a"] == {"stamp_jitter": 5}


def test_every_rebase_is_counted_and_the_gap_after_it_is_unknown_time() -> None:
    dev = DeviceIntegrator()
    dev.integrate(reading(grid(100.0, 5, 100.0)), at(100.5))
    dev.integrate(reading(grid(100.5, 5, 100.0)), at(101.0))
    for newest in (90_000_000, 80_000_000):  # the clock went back 10 s, twice
        dev.integrate(reading((), util_newest=newest), at(102.0))
    got = dev.integrate(reading(grid(110.0, 3, 100.0)), at(110.5))
    assert got.unknown == pytest.approx(30.0)  # from 80 s to the first new sample
    assert dev.events.counts["GPU-a"] == {"device_rebase": 2}
    assert dev.device_unknown["GPU-a"] == pytest.approx(30.0)


def test_a_process_cursor_ahead_of_the_drivers_samples_is_rebased() -> None:
    dev = DeviceIntegrator()
    dev.integrate(reading(None, process_samples=(ProcessUtilSample(1, 9_000_000_000, 30.0),),
                          pids=(1,)), AT)
    dev.integrate(reading(None, process_samples=(), pids=(1,), process_newest=5_000_000), AT)
    assert dev.driver_cursors()["GPU-a"][1] == 5_000_000


def test_a_driver_on_no_host_clock_is_logged_once_per_gpu(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dev = DeviceIntegrator()
    with caplog.at_level(logging.WARNING):
        for i in range(3):
            got = dev.integrate(reading(grid(50_000.0 + i, 3, 0.0)), AT)
            assert got.clock is None
    assert len(caplog.records) == 1


def test_state_round_trip_and_pruning_of_gpus_no_longer_present() -> None:
    dev = DeviceIntegrator()
    for uuid in ("GPU-a", "GPU-b"):
        dev.integrate(reading(grid(100.0, 3, 100.0), uuid=uuid), at(100.2))
        dev.integrate(reading(grid(100.3, 3, 100.0), uuid=uuid, pids=(4,), process_samples=(
            ProcessUtilSample(4, 100_300_000, 10.0),)), at(100.5))
    dev.prune({"GPU-b"})
    assert set(dev.cursors) == set(dev.device_busy) == {"GPU-b"}
    saved = dev.export_state()
    again = DeviceIntegrator()
    again.import_state(saved, {**saved["cursors_by_gpu"], "GPU-bad": [1]})
    assert again.driver_cursors() == dev.driver_cursors()
    assert again.device_busy == dev.device_busy
    assert again.cursors["GPU-b"].device_clock == "boottime"
    assert not again.cursors["GPU-b"].continuous  # the gap to the next sample: unknown


def test_a_gpu_dry_from_its_first_read_counts_the_time_between_reads_as_idle() -> None:
    dev = DeviceIntegrator()
    assert dev.integrate(reading(()), at(100.0)).window == 0.0
    idle = dev.integrate(reading(()), at(102.0))
    assert idle.window == pytest.approx(2.0) and idle.busy == 0.0


def test_the_first_samples_of_a_gpu_idle_since_the_agent_started_are_counted() -> None:
    dev = DeviceIntegrator()
    dev.integrate(reading(()), at(100.0))
    dev.integrate(reading(()), at(102.0))
    first = dev.integrate(reading(grid(102.5, 5, 100.0)), at(103.0))
    # Every sample is new since the dry read at 102 s: 0.5 s busy, and 0.5 s idle before.
    assert first.busy == pytest.approx(0.5) and first.window == pytest.approx(1.0)
    assert dev.device_busy["GPU-a"] == pytest.approx(0.5)


def test_the_measured_period_is_the_median_spacing_of_the_samples() -> None:
    from slurm_gpu_exporter.gpu.driver.gaps import measured_period_us

    def at(*stamps: int) -> tuple[UtilSample, ...]:
        return tuple(UtilSample(t, 0.0) for t in stamps)

    assert measured_period_us(at(0, 100, 300, 600, 1600)) == 250  # 100 200 300 1000
    assert measured_period_us(at(0, 100, 200, 700)) == 100  # 100 100 500
    assert measured_period_us(at(0, 100), previous_us=170) == 170  # too few to say
