"""The fake's device sample buffers are rings of samples taken, as a driver keeps.

A driver keeps the newest ``buffer_samples`` samples it took and overwrites the
oldest. Where it takes no sample while the GPU is idle (``idle_samples 0``, the
real-driver default) or misses one, that sample takes no slot: the ring of a GPU
busy now and then reaches back far more than ``buffer_samples`` periods, and it
holds still while the GPU is idle. Driven through the real nvidia-ml-py.
"""

from __future__ import annotations

import itertools
import time
from typing import Literal

import pytest

from tests.fakenvml import Device, FakeNvml, NvmlState, Pattern, Process
from tests.fakenvml.test_fakenvml import run

pytestmark = pytest.mark.fakenvml

N = 30
PERIOD_S = 0.167
PERIOD_US = 167_000
# 1 s busy every 20 s: about six samples a burst, so 30 slots reach back five bursts.
BURST_S, EVERY_S = 1.0, 20.0


READS = """
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)

def read(kind, since):
    got = call(N.nvmlDeviceGetSamples, h, kind, since)
    return got if isinstance(got, str) else [[s.timeStamp, s.sampleValue.uiVal] for s in got[1]]

util = read(N.NVML_GPU_UTILIZATION_SAMPLES, 0)
"""


def _bursty(fake: FakeNvml, clock: Literal["boot", "epoch"] = "epoch",
            grid: bool = False) -> Pattern:
    """A GPU whose last burst ended a second ago and whose next is 18 s away; its
    idle samples are not taken (the default). Jittered samples, some missing (the
    defaults), unless on the grid. On the boot clock the node booted an hour ago,
    whatever the host's uptime: the ring reaches back five bursts (100 s), and on a
    host booted a minute ago nothing is older than its boot."""
    now = time.time()
    pattern = Pattern.square(BURST_S, EVERY_S, origin=now - BURST_S - 1.0)
    state = NvmlState(buffer_samples=N, device_clock=clock,
                      boot_time=now - 3600.3 if clock == "boot" else None,
                      devices=[Device(0, power_w=150.0, util=pattern)])
    if grid:
        state.sample_jitter, state.sample_missing_every = 0.0, 0
    fake.write(state)
    return pattern


def _in_a_burst(pattern: Pattern, ts_us: int) -> bool:
    """A sample that covers some busy time: stamped in a burst or within two periods
    (the one after it may be missing) and a jitter after one."""
    phase = (ts_us / 1e6 - pattern.origin) % EVERY_S
    return phase <= BURST_S + 2.5 * PERIOD_S


def test_a_bursty_gpu_s_ring_holds_n_samples_from_far_more_than_n_periods_back(
    fake: FakeNvml,
) -> None:
    pattern = _bursty(fake)
    got = run(fake, READS + """
time.sleep(1.0)  # idle: nothing is taken, so nothing is overwritten
again = read(N.NVML_GPU_UTILIZATION_SAMPLES, 0)
out({"util": util, "again": again})
""")
    util = got["util"]
    stamps = [ts for ts, _ in util]
    assert len(util) == N
    assert stamps == sorted(set(stamps))
    span_periods = (stamps[-1] - stamps[0]) / PERIOD_US
    assert span_periods > 3 * N, span_periods  # five bursts 20 s apart: about 480 periods
    assert all(v > 0 for _, v in util)  # idle samples take no slot
    assert all(_in_a_burst(pattern, ts) for ts in stamps), [
        round((ts / 1e6 - pattern.origin) % EVERY_S, 3) for ts in stamps]
    assert abs(stamps[-1] / 1e6 - (pattern.origin + BURST_S)) < 2.5 * PERIOD_S  # the last burst
    assert got["again"] == util  # an idle GPU's ring holds still


def test_a_gpu_busy_all_the_time_holds_n_samples_n_minus_1_periods_apart(
    fake: FakeNvml,
) -> None:
    now = time.time()
    fake.write(NvmlState(buffer_samples=N, device_clock="epoch", sample_jitter=0.0,
                         sample_missing_every=0, devices=[Device(0, processes=[
                             Process(7, sm=Pattern.constant(100), start_time=now - 60)])]))
    got = run(fake, READS + """
out({"util": util, "mem": read(N.NVML_MEMORY_UTILIZATION_SAMPLES, 0), "now": time.time()})
""")
    stamps = [ts for ts, _ in got["util"]]
    assert len(stamps) == N
    assert all(b - a == PERIOD_US for a, b in itertools.pairwise(stamps))  # N - 1 periods
    assert 0 <= got["now"] - stamps[-1] / 1e6 < 2 * PERIOD_S
    assert {v for _, v in got["util"]} == {100}
    assert [ts for ts, _ in got["mem"]] == stamps and {v for _, v in got["mem"]} == {50}


def test_missing_samples_take_no_slot(fake: FakeNvml) -> None:
    now, slots = time.time(), 120  # enough for some to be missing, whatever the hour
    fake.write(NvmlState(buffer_samples=slots, device_clock="epoch", sample_missing_every=4,
                         devices=[Device(0, processes=[
                             Process(7, sm=Pattern.constant(100), start_time=now - 60)])]))
    got = run(fake, READS + 'out({"util": util})')
    stamps = [ts for ts, _ in got["util"]]
    missing = sum(round((b - a) / PERIOD_US) - 1 for a, b in itertools.pairwise(stamps))
    assert len(stamps) == slots
    assert missing >= 5  # about one in six (one in four, never two in a row): 20 or so
    # The slots, and a period for each missing sample, give or take a sample's jitter.
    assert abs((stamps[-1] - stamps[0]) / PERIOD_US - (slots - 1 + missing)) < 0.31


@pytest.mark.parametrize("clock", ["epoch", "boot"])
def test_a_read_on_from_a_timestamp_gets_only_newer_samples_of_the_ring(
    fake: FakeNvml, clock: Literal["boot", "epoch"]
) -> None:
    _bursty(fake, clock)
    got = run(fake, READS + """
U = N.NVML_GPU_UTILIZATION_SAMPLES
out({"util": util, "from_each": [read(U, ts) for ts, _ in util],
     "from_just_before": read(U, util[0][0] - 1), "from_before": read(U, util[0][0] - 167_000),
     "from_the_start": read(U, 1)})
""")
    util = got["util"]
    assert len(util) == N
    # Each stamp read on from gives the samples after it, once each; none after the newest.
    assert got["from_each"] == [util[i + 1:] for i in range(N - 1)] + ["ERR:NOT_FOUND"]
    # Nothing older than the ring's oldest sample, however far back a read starts.
    assert got["from_just_before"] == util  # within the oldest one's period, before its stamp
    assert got["from_before"] == util
    assert got["from_the_start"] == util  # the clock's first µs: long before, on either clock


def test_power_samples_are_taken_while_idle_so_their_ring_spans_n_periods(
    fake: FakeNvml,
) -> None:
    _bursty(fake, grid=True)
    got = run(fake, READS + """
out({"util": util, "power": read(N.NVML_TOTAL_POWER_SAMPLES, 0), "now": time.time()})
""")
    power = [ts for ts, _ in got["power"]]
    assert len(power) == N
    assert all(b - a == PERIOD_US for a, b in itertools.pairwise(power))
    assert 0 <= got["now"] - power[-1] / 1e6 < 2 * PERIOD_S  # taken while idle too
    assert {v for _, v in got["power"]} == {150_000}  # mW
    util = [ts for ts, _ in got["util"]]
    assert len(util) == N and (util[-1] - util[0]) / PERIOD_US > 3 * N


def test_the_agent_learns_a_bursty_gpu_s_buffer_length_exactly(fake: FakeNvml) -> None:
    """gpu/driver/buffers.py takes the samples a whole read holds as the buffer's length once
    its oldest moves on: over the ring that is buffer_samples, burst after burst. The
    ring reaches back 50 s, so the boot is an hour back whatever the host's uptime."""
    fake.write(NvmlState(buffer_samples=N, time_scale=10.0, boot_time=time.time() - 3600,
                         devices=[Device(0, util=Pattern.square(BURST_S, 10.0))]))
    got = run(fake, """
from slurm_gpu_exporter.gpu.driver.buffers import BufferStash
from slurm_gpu_exporter.gpu.nvml.sample_buffers import util_samples_after
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
stash, errors, held, end = BufferStash(), [], set(), time.monotonic() + 3.5  # 35 s: 3 bursts
while time.monotonic() < end:
    _, shape = util_samples_after(h, 0, errors)
    stash.whole(shape)
    held.add(shape.held)
    time.sleep(0.05)
out({"full": stash.full, "capacity": stash.capacity, "held": sorted(held), "errors": errors})
""", timeout=60)
    assert got["errors"] == []
    assert got["held"] == [N]
    assert got["full"] == N and got["capacity"] == N


def test_a_read_on_from_the_newest_stamp_on_the_boot_clock_returns_none_again(
    fake: FakeNvml,
) -> None:
    """Grid stamps on a boot clock whose boot is not on a whole microsecond: a stamp
    taken back to the fake's clock comes out 1 µs early, which made the sample it
    stamps come back again when compared there."""
    now = time.time()
    fake.write(NvmlState(buffer_samples=N, boot_time=now - 1000.3, sample_jitter=0.0,
                         sample_missing_every=0, devices=[Device(0, processes=[
                             Process(7, sm=Pattern.constant(100), start_time=now - 60)])]))
    got = run(fake, READS + """
U = N.NVML_GPU_UTILIZATION_SAMPLES
out({"util": util, "again": [read(U, ts) for ts, _ in util[-3:-1]]})
""")
    util = got["util"]
    assert len(util) == N
    assert got["again"] == [util[-2:], util[-1:]]


def test_a_process_read_on_from_its_newest_stamp_on_the_boot_clock_returns_none_again(
    fake: FakeNvml,
) -> None:
    """The same for process samples (grid mode, process samples on that boot clock):
    a read on from the newest stamp must not return the sample it stamps."""
    now = time.time()
    fake.write(NvmlState(buffer_samples=N, boot_time=now - 1000.3, process_clock="boot",
                         process_util_mode="grid", process_stagger_s=0.0,
                         devices=[Device(0, processes=[
                             Process(7, sm=Pattern.constant(100), start_time=now - 60)])]))
    got = run(fake, """
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)

def stamps(since):
    got = call(N.nvmlDeviceGetProcessUtilization, h, since)
    return got if isinstance(got, str) else sorted(s.timeStamp for s in got)

every = stamps(0)
out({"every": every, "again": [stamps(ts) for ts in every[-3:]]})
""")
    every = got["every"]
    assert len(every) >= 3, every
    assert got["again"] == [every[-2:], every[-1:], "ERR:NOT_FOUND"]
