"""Reads of the driver's sample buffers between two polls (gpu/driver/buffers.py), on plain
numbers."""

from __future__ import annotations

import pytest

from slurm_gpu_exporter.gpu.driver.buffers import BufferStash
from slurm_gpu_exporter.gpu.driver.integration import DeviceIntegrator
from slurm_gpu_exporter.gpu.readings import BufferRead, BufferShape, UtilSample
from tests.gpu.test_gpu_integration import at, reading

PERIOD_S = 1 / 6
BUFFER = 120  # samples: 20 s at 1/6 s


def driver_buffer(now_s: float, after_s: float = 0.0) -> tuple[UtilSample, ...]:
    """What a driver busy 100 % since 0 s holds at ``now_s``: its last BUFFER samples,
    those after ``after_s``."""
    last = int(now_s / PERIOD_S)
    stamps = (round(k * PERIOD_S * 1e6) for k in range(max(1, last - BUFFER + 1), last + 1))
    return tuple(UtilSample(ts, 100.0) for ts in stamps if ts > after_s * 1e6)


def test_reads_between_polls_keep_a_60_s_interval_from_losing_a_20_s_buffer() -> None:
    dev = DeviceIntegrator()
    dev.integrate(reading(driver_buffer(100.0)), at(100.0))  # the first look
    assert dev.read_interval() == pytest.approx(5.0, abs=0.01)
    for t in range(105, 160, 5):
        since = dev.buffers.cursors(dev.cursors)["GPU-a"][0] / 1e6
        dev.keep_reads([BufferRead("GPU-a", driver_buffer(t, since), None)], at(t))
    since = dev.driver_cursors()["GPU-a"][0] / 1e6
    got = dev.integrate(reading(driver_buffer(160.0, since)), at(160.0))
    assert got.busy == pytest.approx(60.0, abs=0.2) and got.window == pytest.approx(got.busy)
    assert got.unknown == 0.0 and dev.events.counts == {}


def test_a_poll_later_than_the_buffer_holds_counts_the_lost_gap_as_unknown_not_idle() -> None:
    dev = DeviceIntegrator()
    dev.integrate(reading(driver_buffer(100.0)), at(100.0))
    got = dev.integrate(reading(driver_buffer(160.0, 100.0)), at(160.0))  # a 60 s stall
    assert got.busy == pytest.approx(20.0, abs=0.2)
    assert got.unknown == pytest.approx(40.0, abs=0.2)
    assert got.window == pytest.approx(got.busy)  # not 60 s of which 40 idle
    assert dev.events.counts["GPU-a"] == {"buffer_overrun": 1}
    assert dev.device_unknown["GPU-a"] == pytest.approx(40.0, abs=0.2)


def test_the_span_is_learned_from_the_most_samples_a_read_returned() -> None:
    stash = BufferStash()
    assert stash.span_s(166_667) == 20.0  # none learned yet: the floor
    stash.note(tuple(UtilSample(k * 166_667, 50.0) for k in range(1, 1201)), 0, 10.0,
               166_667, 416_667)
    assert stash.span_s(166_667) == pytest.approx(200.0, rel=1e-3)
    assert stash.read_interval(166_667) == pytest.approx(50.0, rel=1e-3)


def test_a_buffer_shorter_than_the_default_is_learned_once_seen_full_and_read_in_time() -> None:
    stash = BufferStash()
    whole = tuple(UtilSample(k * 166_667, 100.0) for k in range(1, 31))  # 30 samples: 5 s
    stash.note(whole[-6:], whole[-7].timestamp_us, 10.0, 166_667, 416_667,
               BufferShape(30, whole[0].timestamp_us))
    assert stash.span_s(166_667) == 20.0  # not seen full yet: the default
    # One period later the buffer still holds 30, its oldest gone: full, 5 s long.
    stash.note((UtilSample(31 * 166_667, 100.0),), whole[-1].timestamp_us, 10.2, 166_667,
               416_667, BufferShape(30, whole[1].timestamp_us))
    assert stash.span_s(166_667) == pytest.approx(5.0, rel=1e-3)
    assert stash.read_interval(166_667) == pytest.approx(1.25, rel=1e-3)
    # A read 6 s later than the last finds a gap before its first new sample: possibly
    # overwritten, not idle.
    assert stash.note((UtilSample(80 * 166_667, 100.0),), 31 * 166_667, 16.2, 166_667,
                      416_667, BufferShape(30, 51 * 166_667))


def test_reads_between_polls_read_the_whole_device_buffer() -> None:
    dev = DeviceIntegrator()
    dev.integrate(reading(driver_buffer(100.0)), at(100.0))
    assert dev.buffers.read_cursors(dev.cursors)["GPU-a"][0] == 0
    assert dev.buffers.cursors(dev.cursors)["GPU-a"][0] > 0  # a poll reads past its cursor
    # The whole buffer, read 12 s late over a 20 s one: nothing lost, nothing unknown.
    dev.keep_reads([BufferRead("GPU-a", driver_buffer(105.0), None)], at(105.0))
    dev.keep_reads([BufferRead("GPU-a", driver_buffer(117.0), None)], at(117.0))
    got = dev.integrate(reading(driver_buffer(120.0, dev.driver_cursors()["GPU-a"][0] / 1e6)),
                        at(120.0))
    assert got.busy == pytest.approx(20.0, abs=0.2) and got.unknown == 0.0


def test_a_driver_reload_drops_what_was_read_between_polls_with_the_cursors() -> None:
    dev = DeviceIntegrator()
    dev.integrate(reading(driver_buffer(100.0)), at(100.0))
    dev.keep_reads([BufferRead("GPU-a", driver_buffer(105.0, 100.0), None)], at(105.0))
    dev.drop_cursors("a driver reload")
    assert dev.driver_cursors() == {}
    first = dev.integrate(reading(driver_buffer(5.0)), at(5.0))  # its clock restarted
    assert (first.window, first.busy) == (0.0, 0.0)  # a first look, nothing of the old
    assert dev.driver_cursors()["GPU-a"][0] == driver_buffer(5.0)[-1].timestamp_us
