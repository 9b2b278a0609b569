"""CPU time of the agent's reads of the driver's sample buffers between two samples.

8 GPUs on the fake NVML (tests/fakenvml), loaded by the real nvidia-ml-py: idle ones
(an empty node: every read says NOT_FOUND) and busy ones. The fake's clock runs
1000x, so reads 5 ms apart find 5 s of samples each, as the agent's do. A read is
``GpuSampler.read_buffers``: two NVML calls per GPU, the daemon thread it runs in,
and stashing the samples. The reads come every quarter of a 20 s buffer (5 s) only
where ``--sample-interval`` is longer than that: at 60 s, 11 a minute. The figure is
CPU per minute, the fake's own time included.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import record

from tests.fakenvml import Device, NvmlState, Pattern, Process, fake_nvml_or_skip

READS = 200
CHILD = """
import sys, time
from pathlib import Path
from slurm_gpu_exporter.gpu.readings import BufferRead
from slurm_gpu_exporter.gpu.nvml.backend import NvmlBackend
from slurm_gpu_exporter.gpu.source import GpuSampler
from slurm_gpu_exporter.node.source_health import SourceErrors

gpu = GpuSampler(NvmlBackend(), Path("/proc"), SourceErrors())
gpu.sample([], time.time())  # the first look: cursors and stashes for every GPU
reads = int(sys.argv[1])
cpu0 = time.process_time()
for _ in range(reads):
    time.sleep(0.005)  # 5 s of driver time at the fake's time scale of 1000
    gpu.read_buffers()
cpu = (time.process_time() - cpu0) / reads
gpu.close()
print(f"{cpu * 1e3:.4f}")
"""


def per_read_ms(busy: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        fake = fake_nvml_or_skip(Path(tmp) / "nvml")
        now = time.time()
        procs = lambda i: [Process(1000 + i, 1, sm=Pattern.constant(60), start_time=now - 60)]  # noqa: E731
        fake.write(NvmlState(time_scale=1000.0, time_origin=now, buffer_samples=120,
                             devices=[Device(i, processes=procs(i) if busy else [])
                                      for i in range(8)]))
        env = fake.env()
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
        out = subprocess.run([sys.executable, "-c", CHILD, str(READS)], env=env, check=True,
                             capture_output=True, text=True, timeout=300).stdout
        return float(out.strip().splitlines()[-1])


def main() -> None:
    idle, busy = per_read_ms(False), per_read_ms(True)
    per_minute = 60 / 5 - 1  # reads a minute at --sample-interval 60 (every 5 s, one is the sample)
    record("buffer_reads", {
        "gpus": 8,
        "cpu_ms_per_read_idle_8gpus": round(idle, 3),
        "cpu_ms_per_read_busy_8gpus": round(busy, 3),
        "reads_per_minute_at_interval_60s": per_minute,
        "cpu_ms_per_minute_idle": round(idle * per_minute, 2),
        "cpu_ms_per_minute_busy": round(busy * per_minute, 2),
        "cpu_count": os.cpu_count(),
    })


if __name__ == "__main__":
    main()
