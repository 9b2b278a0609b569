"""Each kind of ``slurm_gpu_driver_events_total`` counts when its event happens, and
RAPL's wrap handling leaves an unchanged counter at 0 (pure: plain readings, a powercap
tree in a temporary directory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gpu_exporter.gpu.driver.events import EVENT_KINDS
from slurm_gpu_exporter.gpu.driver.integration import DeviceIntegrator
from slurm_gpu_exporter.gpu.readings import HostClocks, ProcessUtilSample, UtilSample
from slurm_gpu_exporter.node.powercap import PowercapReader, wrapped_delta
from tests.gpu.test_gpu_integration import AT, at, grid, reading
from tests.support import REPO
from tests.support.powercap import PowercapTree


def test_a_process_cursor_rebased_is_counted_each_time() -> None:
    dev = DeviceIntegrator()
    dev.integrate(reading(None, process_samples=(ProcessUtilSample(1, 9_000_000_000, 30.0),),
                          pids=(1,)), AT)
    # the driver's newest process sample is 8995 s behind the cursor: its clock went back
    dev.integrate(reading(None, pids=(1,), process_newest=5_000_000), AT)
    assert dev.events.counts["GPU-a"] == {"process_rebase": 1}
    dev.integrate(reading(None, process_samples=(ProcessUtilSample(1, 6_000_000, 30.0),),
                          pids=(1,)), AT)
    dev.integrate(reading(None, pids=(1,), process_newest=1_000_000), AT)
    assert dev.events.counts["GPU-a"] == {"process_rebase": 2}


def test_a_process_sample_reread_a_little_older_is_jitter_not_a_rebase() -> None:
    dev = DeviceIntegrator()
    dev.integrate(reading(None, process_samples=(ProcessUtilSample(1, 9_000_000_000, 30.0),),
                          pids=(1,)), AT)
    dev.integrate(reading(None, pids=(1,), process_newest=8_999_999_000), AT)
    assert dev.events.counts["GPU-a"] == {"stamp_jitter": 1}
    assert dev.driver_cursors()["GPU-a"][1] == 9_000_000_000  # not moved back


def test_a_device_sample_reread_a_little_older_is_counted_as_jitter() -> None:
    dev = DeviceIntegrator()
    dev.integrate(reading(grid(100.0, 5, 100.0)), at(100.5))
    dev.integrate(reading((), util_newest=100_399_000), at(101.5))
    assert dev.events.counts["GPU-a"] == {"stamp_jitter": 1}


def test_a_device_sample_over_100_percent_is_clamped_and_counted_as_clamped() -> None:
    dev = DeviceIntegrator()
    dev.integrate(reading(grid(100.0, 5, 50.0)), at(100.5))
    got = dev.integrate(reading((*grid(100.5, 4, 50.0), UtilSample(100_900_000, 130.0))),
                        at(101.0))
    assert dev.events.counts["GPU-a"] == {"clamped": 1}
    # four samples at 50 % and one clamped to 100 %, 0.1 s each
    assert got.busy == pytest.approx(0.4 * 0.5 + 0.1 * 1.0)


def test_device_samples_moving_to_another_host_clock_count_a_clock_change() -> None:
    dev = DeviceIntegrator()

    def clocks(monotonic: float) -> HostClocks:  # boottime 4000 s ahead (a suspend)
        return HostClocks(realtime=1_800_000_000.0 + monotonic, boottime=monotonic + 4000.0,
                          monotonic=monotonic)

    first = dev.integrate(reading(grid(1000.0, 5, 50.0)), clocks(1000.5))
    assert first.clock == "monotonic"
    second = dev.integrate(reading(grid(5001.0, 5, 50.0)), clocks(1001.5))
    assert second.clock == "boottime"
    assert dev.events.counts["GPU-a"] == {"clock_change": 1}


def test_every_kind_a_test_makes_happen_is_one_the_docs_list() -> None:
    # the kinds these tests and test_gpu_integration/test_gpu_buffers count
    made = {"process_rebase", "device_rebase", "stamp_jitter", "clamped", "out_of_range",
            "clock_change", "buffer_overrun"}
    assert made == set(EVENT_KINDS)
    listed = REPO / "docs" / "metrics.md"
    row = next(line for line in listed.read_text().splitlines()
               if line.startswith("| `slurm_gpu_driver_events_total`"))
    assert all(f"`{kind}`" in row for kind in EVENT_KINDS), row


def test_an_unchanged_rapl_counter_adds_nothing(tmp_path: Path) -> None:
    assert wrapped_delta(500, 500, 1000) == 0
    assert wrapped_delta(999, 0, 1000) == 1  # a wrap past the top still counts
    tree = PowercapTree(tmp_path, sockets=1)
    tree.set("intel-rapl:0", 123_000_000)
    reader = PowercapReader(tmp_path)
    assert reader.rediscover() == []
    assert all(r.joules is None for r in reader.read())  # the first read has no delta
    assert [r.joules for r in reader.read()] == [0.0, 0.0]  # nothing used: nothing counted
    tree.set("intel-rapl:0", 124_500_000)
    assert sorted(r.joules or 0.0 for r in reader.read()) == [0.0, 1.5]


def test_the_gpus_unknown_time_adds_up_over_separate_gaps() -> None:
    dev = DeviceIntegrator()
    dev.integrate(reading(grid(100.0, 5, 100.0)), at(100.5))
    dev.integrate(reading(grid(100.5, 5, 100.0)), at(101.0))  # cursor at 100.9 s
    gaps = []
    for back_to, resumes in ((90.0, 95.0), (80.0, 85.0)):  # the clock went back twice
        dev.integrate(reading((), util_newest=int(back_to * 1e6)), at(102.0))
        got = dev.integrate(reading(grid(resumes, 3, 100.0)), at(102.5))
        gaps.append(got.unknown)
    # each time from where the cursor was moved back to the first new sample: 5 s
    assert gaps == [pytest.approx(5.0), pytest.approx(5.0)]
    assert dev.device_unknown["GPU-a"] == pytest.approx(10.0)
    assert dev.events.counts["GPU-a"] == {"device_rebase": 2}
