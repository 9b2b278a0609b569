"""The fake's sample stamps follow the host clock they are on, whatever the others do.

A driver that stamps on CLOCK_BOOTTIME keeps stamping on it when the wall clock is
stepped (NTP in a new VM's first minutes), and on a node booted a minute ago its
stamps are a minute's worth of µs; one on the wall clock moves with the step. The
reader runs with shifted clocks: the clock shim (no privileges needed) or a time
namespace of its own (root), so these hold at any uptime of the test host.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
import time
from typing import Any, Literal

import pytest

from tests.fakenvml import Device, FakeNvml, NvmlState, Pattern, Process
from tests.fakenvml.clock_shim import (
    booted_env,
    shifted_env,
    time_namespace_argv,
    time_namespace_problem,
)
from tests.fakenvml.test_fakenvml import PRELUDE
from tests.support import require

pytestmark = pytest.mark.fakenvml

PERIOD_S = 0.167
PERIOD_US = 167_000

READER = PRELUDE + """
import ctypes, os
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
U = N.NVML_GPU_UTILIZATION_SAMPLES

def device(since=0):
    got = call(N.nvmlDeviceGetSamples, h, U, since)
    return got if isinstance(got, str) else [s.timeStamp for s in got[1]]

def process():
    got = call(N.nvmlDeviceGetProcessUtilization, h, 0)
    return got if isinstance(got, str) else [s.timeStamp for s in got]

def clocks():
    return {"boot": time.clock_gettime(time.CLOCK_BOOTTIME),
            "real": time.clock_gettime(time.CLOCK_REALTIME)}
"""


def _busy(fake: FakeNvml, device_clock: Literal["boot", "epoch"] = "boot",
          buffer_samples: int = 120) -> None:
    """A GPU busy since two hours ago, samples on the grid, none missing; one process
    sample per read, current (no stagger)."""
    since = time.time() - 7200
    fake.write(NvmlState(device_clock=device_clock, buffer_samples=buffer_samples,
                         sample_jitter=0.0, sample_missing_every=0, process_stagger_s=0.0,
                         devices=[Device(0, processes=[
                             Process(7, sm=Pattern.constant(100), start_time=since)])]))


def _read(argv: list[str], env: dict[str, str], body: str) -> Any:
    proc = subprocess.run([*argv, sys.executable, "-c", READER + textwrap.dedent(body)],
                          env=env, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _behind(clock_s: float, stamp_us: int) -> float:
    """How far a sample stamp is behind a clock reading, in sample periods."""
    return (clock_s - stamp_us / 1e6) / PERIOD_S


@pytest.mark.parametrize("step_s", [3600.0, -3600.0])
@pytest.mark.parametrize("device_clock", ["boot", "epoch"])
def test_a_wall_clock_step_moves_the_epoch_stamps_and_not_the_boot_clock_ones(
    fake: FakeNvml, device_clock: Literal["boot", "epoch"], step_s: float,
) -> None:
    _busy(fake, device_clock)
    got = _read([], shifted_env(fake.env()), f"""
        shim = ctypes.CDLL(os.environ["LD_PRELOAD"].split(":")[0])
        shim.clock_shim_step.argtypes = (ctypes.c_int, ctypes.c_double)
        before, procs_before, at_before = device(), process(), clocks()
        shim.clock_shim_step(time.CLOCK_REALTIME, {step_s!r})  # NTP steps the wall clock
        time.sleep(0.6)
        after, procs_after, at_after = device(), process(), clocks()
        out({{"before": before, "after": after, "since": device(before[-1]),
              "procs_before": procs_before, "procs_after": procs_after,
              "at_before": at_before, "at_after": at_after}})
    """)
    on = "boot" if device_clock == "boot" else "real"
    before, after, since = got["before"], got["after"], got["since"]
    assert isinstance(before, list) and isinstance(after, list), (before, after)
    # The newest sample is the one of the current period on its clock, before and after.
    assert 0 <= _behind(got["at_before"][on], before[-1]) < 1.5
    assert 0 <= _behind(got["at_after"][on], after[-1]) < 1.5, (after[-1], got["at_after"])
    if device_clock == "boot":
        # The boot clock went on: the samples since the step are the 0.6 s it took.
        assert since == after[-len(since):] and since[0] == before[-1] + PERIOD_US
        assert 2 <= len(since) <= 12, since
    else:
        assert (after[-1] - before[-1]) / 1e6 == pytest.approx(step_s, abs=5)
    # Process samples are on the wall clock (the default) and move with it.
    assert 0 <= _behind(got["at_before"]["real"], max(got["procs_before"])) < 1.5
    assert 0 <= _behind(got["at_after"]["real"], max(got["procs_after"])) < 1.5


def _young_node_checks(got: dict[str, Any], up_s: float) -> None:
    stamps, boot = got["stamps"], got["boot"]
    assert boot == pytest.approx(up_s, abs=10)
    assert 0 <= _behind(boot, stamps[-1]) < 1.5, (stamps[-1], boot)
    # Busy for two hours, but nothing is older than the boot: the ring holds the
    # samples since, the oldest in the boot clock's first period.
    assert 0 < stamps[0] <= PERIOD_US
    assert all(b - a == PERIOD_US for a, b in itertools.pairwise(stamps))


def test_on_a_node_booted_a_minute_ago_the_boot_stamps_are_a_minute_of_us(
    fake: FakeNvml,
) -> None:
    _busy(fake, buffer_samples=1200)  # room for more than the boot clock's minute
    got = _read([], booted_env(fake.env(), 60.0),
                'out({"stamps": device(), "boot": clocks()["boot"]})')
    _young_node_checks(got, 60.0)


@pytest.mark.parametrize("up_s", [45, 2_000_000])
def test_boot_stamps_are_on_the_boot_clock_of_the_reader_s_time_namespace(
    fake: FakeNvml, up_s: int,
) -> None:
    """The kernel's own clocks shifted (no shim): a node up 45 s, and one up 23 days.
    Monotonic reads 7 s less (the node slept), so a fake on CLOCK_MONOTONIC shows."""
    problem = time_namespace_problem()
    require(problem is None, str(problem))
    _busy(fake, buffer_samples=1200)
    got = _read(time_namespace_argv(up_s, asleep_s=7), fake.env(),
                'out({"stamps": device(), "boot": clocks()["boot"]})')
    if up_s < 1200 * PERIOD_S:
        _young_node_checks(got, up_s)
    else:
        stamps = got["stamps"]
        assert got["boot"] == pytest.approx(up_s, abs=10)
        assert 0 <= _behind(got["boot"], stamps[-1]) < 1.5, (stamps[-1], got["boot"])
        assert len(stamps) == 1200


def test_an_event_wait_times_out_on_time_when_the_wall_clock_steps_back(fake: FakeNvml) -> None:
    """An hour back in the middle of a 1 s nvmlEventSetWait: on a deadline of the wall
    clock it would wait an hour."""
    _busy(fake)
    got = _read([], shifted_env(fake.env()), """
        import threading
        shim = ctypes.CDLL(os.environ["LD_PRELOAD"].split(":")[0])
        shim.clock_shim_step.argtypes = (ctypes.c_int, ctypes.c_double)
        es = N.nvmlEventSetCreate()
        N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError, es)
        step = threading.Timer(0.2, shim.clock_shim_step, (time.CLOCK_REALTIME, -3600.0))
        step.start()
        t0 = time.monotonic()
        got = call(N.nvmlEventSetWait_v2, es, 1000)
        step.join()
        out({"got": got if isinstance(got, str) else "an event",
             "took": time.monotonic() - t0})
    """)
    assert got["got"] == "ERR:TIMEOUT"
    assert 0.9 <= got["took"] < 5, got
