"""Which host clock a driver's samples are on (gpu/driver/clocks.py), on plain numbers."""

from __future__ import annotations

import pytest

from slurm_gpu_exporter.gpu.driver.clocks import clock_of, wall_to_driver_us
from slurm_gpu_exporter.gpu.readings import HostClocks

AT = HostClocks(realtime=1_800_000_000.0, boottime=5_000_000.0, monotonic=4_000_000.0)


@pytest.mark.parametrize(("newest_s", "clock"), [
    (1_800_000_000.0 - 0.2, "realtime"),
    (5_000_000.0 - 9.0, "boottime"),  # a process sample 9 s old
    (4_000_000.0 - 0.1, "monotonic"),
    (5_000_000.0 - 3600.0, None),  # an hour behind every clock: its own
    (1_800_000_000.0 + 30.0, None),  # ahead of the wall clock: a sped-up test clock
])
def test_a_calls_clock_is_the_host_clock_its_newest_sample_is_least_behind(
    newest_s: float, clock: str | None,
) -> None:
    assert clock_of(int(newest_s * 1e6), AT) == clock


def test_boottime_is_preferred_to_monotonic_on_a_host_that_never_slept() -> None:
    at = HostClocks(realtime=1_800_000_000.0, boottime=5_000.0, monotonic=5_000.0)
    assert clock_of(4_999_000_000, at) == "boottime"


def test_a_wall_time_converts_to_the_drivers_clock_at_the_offset_of_the_reading() -> None:
    assert wall_to_driver_us(1_800_000_000.0 - 10.0, "boottime", AT) == 4_999_990_000_000
    assert wall_to_driver_us(1_799_999_999.5, "realtime", AT) == 1_799_999_999_500_000
    assert wall_to_driver_us(1.0, "boottime", HostClocks(realtime=2.0)) is None
