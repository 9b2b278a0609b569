"""Self-tests of the fake NVML's throttling and error-counter calls, through nvidia-ml-py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakenvml import (
    Device,
    FakeNvml,
    MigInstance,
    NvmlState,
    duty_active_s,
    fake_nvml_or_skip,
)
from tests.fakenvml.test_fakenvml import run

pytestmark = pytest.mark.fakenvml

READ = '''
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
def viol(p):
    v = call(N.nvmlDeviceGetViolationStatus, h, p)
    return v if isinstance(v, str) else [v.referenceTime, v.violationTime]
'''


@pytest.fixture
def fake(tmp_path: Path) -> FakeNvml:
    return fake_nvml_or_skip(tmp_path / "nvml")


def test_violation_counters_advance_by_the_share_of_time_a_reason_is_active(
    fake: FakeNvml,
) -> None:
    fake.write(NvmlState(time_scale=100.0, devices=[
        Device(0, throttle={"power": 0.4, "thermal": 0.0}, violation_base_ns=7)]))
    start = fake.now()
    got = run(fake, READ + '''
import time
a = [viol(0), viol(1), viol(2), viol(11)]
time.sleep(0.5)
out(a + [viol(0)])
''')
    (ref0, power0), (_, thermal), sync_boost, base_clocks, (ref1, power1) = got
    assert sync_boost == base_clocks == "ERR:NOT_SUPPORTED"  # not listed: not supported
    assert thermal == 7  # the base, never active since
    assert ref0 / 1e6 >= start - 1 and ref1 > ref0  # µs on the fake clock
    elapsed = (ref1 - ref0) / 1e6  # ~50 s of fake time
    assert (power1 - power0) / 1e9 == pytest.approx(0.4 * elapsed, abs=0.41)
    assert power0 >= 7


def test_a_rewrite_with_a_new_share_continues_the_counter(fake: FakeNvml) -> None:
    state = NvmlState(time_scale=100.0, devices=[Device(0, throttle={"power": 1.0})])
    fake.write(state)
    first = run(fake, READ + "out(viol(0))")
    state.devices[0].throttle = {"power": 0.0}  # toggled off
    fake.write(state)
    off = run(fake, READ + "out(viol(0))")
    later = run(fake, READ + "import time; time.sleep(0.2); out(viol(0))")
    assert off[1] >= first[1]  # never back
    assert later[1] == off[1]  # off: stands still
    assert duty_active_s(2.5, 0.4) == pytest.approx(1.2)  # 0.4 + 0.4 + min(0.5, 0.4)


def test_reasons_clocks_and_error_counters_as_set_and_mig_handles_refused(
    fake: FakeNvml,
) -> None:
    fake.write(NvmlState(devices=[
        Device(0, throttle={"power": 1.0, "thermal": 0.0, "sync_boost": 1.0},
               sm_clock_mhz=1200, sm_clock_max_mhz=1980, remapped_rows=(2, 1, 0, 0),
               pcie_replays=5, nvlink_errors={0: (1, 2, 3, 4), 3: (10, 0, 0, 0)},
               mig=[MigInstance(1)]),
        Device(1, sm_clock_mhz=None)]))
    got = run(fake, READ + '''
h1 = N.nvmlDeviceGetHandleByIndex(1)
mig = N.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
out([call(N.nvmlDeviceGetSupportedClocksEventReasons, h),
     call(N.nvmlDeviceGetCurrentClocksEventReasons, h),
     call(N.nvmlDeviceGetCurrentClocksThrottleReasons, h),
     call(N.nvmlDeviceGetClockInfo, h, N.NVML_CLOCK_SM),
     call(N.nvmlDeviceGetMaxClockInfo, h, N.NVML_CLOCK_SM),
     list(call(N.nvmlDeviceGetRemappedRows, h)), call(N.nvmlDeviceGetPcieReplayCounter, h),
     [call(N.nvmlDeviceGetNvLinkState, h, link) for link in range(4)],
     [call(N.nvmlDeviceGetNvLinkErrorCounter, h, 0, c) for c in range(5)],
     call(N.nvmlDeviceGetNvLinkErrorCounter, h, 1, 0),
     [[v.nvmlReturn, v.value.ullVal] for v in N.nvmlDeviceGetFieldValues(h, [38, 45, 52, 59, 74])],
     [v.nvmlReturn for v in N.nvmlDeviceGetFieldValues(h1, [38])],
     call(N.nvmlDeviceGetClockInfo, h1, N.NVML_CLOCK_SM),
     [call(f, h1) for f in (N.nvmlDeviceGetRemappedRows, N.nvmlDeviceGetPcieReplayCounter)],
     call(N.nvmlDeviceGetNvLinkState, h1, 0), call(N.nvmlDeviceGetViolationStatus, h1, 0),
     call(N.nvmlDeviceGetViolationStatus, mig, 0)])
''')
    no = "ERR:NOT_SUPPORTED"
    assert got == [
        0x4 | 0x20 | 0x10,  # the listed reasons
        0x4 | 0x10, 0x4 | 0x10,  # power cap and sync boost now; thermal off
        1200, 1980, [2, 1, 0, 0], 5,
        [1, 0, 0, 1], [1, 2, 3, 4, no], no,
        # link totals: crc_flit, crc_data, replay (1 + 10), recovery; other fields refused
        [[0, 3], [0, 4], [0, 11], [0, 2], [3, 0]], [3],
        no, [no, no], no, no, no,
    ]
