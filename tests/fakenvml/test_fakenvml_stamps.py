"""The fake stamps a sample once, as a driver stores it: re-reads return the same µs.

On a host whose clock reads take a system call (no vDSO clock source, as on some
VMs) two back-to-back reads of CLOCK_REALTIME and CLOCK_BOOTTIME are up to a
microsecond apart, and more when the reader is preempted between them. The fake
used to take the boot time from such a pair on every call, so a re-read of a dry
buffer now and then returned its newest sample 1 µs older than before: an agent
took that for its clock going back and lost the idle time after it. A small
LD_PRELOAD shim makes CLOCK_BOOTTIME read 0..750 ns late, in turn, to make that
host here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fakenvml import Device, FakeNvml, NvmlState, Pattern, Process, fake_nvml_or_skip

pytestmark = pytest.mark.fakenvml

SHIM = r"""
#define _GNU_SOURCE
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
static unsigned n;
int clock_gettime(clockid_t c, struct timespec *t)
{
    int rc = (int)syscall(SYS_clock_gettime, c, t);
    if (rc == 0 && c == CLOCK_BOOTTIME) {
        t->tv_nsec += (long)(__atomic_fetch_add(&n, 1, __ATOMIC_RELAXED) % 4) * 250;
        if (t->tv_nsec >= 1000000000L) {
            t->tv_nsec -= 1000000000L;
            t->tv_sec++;
        }
    }
    return rc;
}
"""

READS = """
import json, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
seen = set()
for _ in range(400):
    _, got = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    seen.add(max(s.timeStamp for s in got))
print(json.dumps(sorted(seen)))
"""


def _jittery_boot_clock(tmp: Path) -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    src, lib = tmp / "jitter.c", tmp / "jitter.so"
    src.write_text(SHIM)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def test_a_dry_buffer_re_read_returns_the_same_newest_stamp_however_the_clocks_jitter(
    tmp_path: Path,
) -> None:
    fake: FakeNvml = fake_nvml_or_skip(tmp_path / "nvml")
    real0 = time.time()
    busy_then_idle = Pattern([(1.0, 100.0)], origin=real0, repeat=False)
    fake.write(NvmlState(devices=[Device(0, processes=[
        Process(11, 1, sm=busy_then_idle, start_time=real0)])]))  # fmt: skip
    time.sleep(1.5)  # the burst is over: the buffer holds its samples and no newer
    env = fake.env()
    env["LD_PRELOAD"] = str(_jittery_boot_clock(tmp_path))
    proc = subprocess.run([sys.executable, "-c", READS], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    newest = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(newest) == 1, f"the newest sample was stamped {len(newest)} ways: {newest}"
