"""What NVML GPM sampling adds per GPU per sample, over the fake NVML (tests/fakenvml).

Runs the real NVML backend (nvidia-ml-py over the fake libnvidia-ml) on a node of 8
GPUs twice, with GPM on every GPU and with none, and reports the CPU time of a whole
read and of the GPM part alone (sample, metrics, conversion), per GPU per sample; then
the sampler's GPM bookkeeping (device totals, the job's share) per GPU. The fake's own
work runs in this process and is included, so the figures are an upper bound for
what the Python side costs. Budget (issue 10): under 1 ms of CPU per GPU per sample.

    .venv/bin/python bench/gpm.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

GPUS = 8
READS = 300
MIG_GIS = (1, 2, 3, 4, 5, 6, 7)


def _node(gpm: bool, mig: bool) -> object:
    from tests.fakenvml import Device, MigInstance, NvmlState, Pattern, Process

    traces = {"sm_util": 25.0, "sm_occupancy": 30.0, "tensor": Pattern.square(1, 4, 80),
              "dram": 40.0, "fp16": 5.0, "pcie_tx": 900.0, "nvlink_rx": 20000.0}
    devices = []
    for i in range(GPUS):
        procs = [Process(1000 + i, 1 << 30, sm=Pattern.constant(90))]
        instances = [MigInstance(gi, gpm={"sm_util": 10.0 * gi}) for gi in MIG_GIS] if mig else []
        devices.append(Device(i, processes=[] if mig else procs, mig=instances,
                              gpm=dict(traces) if gpm else None))
    return NvmlState(devices=devices, buffer_samples=1200)


def _child() -> None:
    """Inside the fake's environment: time reads with and without GPM."""
    from slurm_gpu_exporter.gpu.nvml import gpm as gpm_module
    from slurm_gpu_exporter.gpu.nvml.backend import NvmlBackend

    backend = NvmlBackend()
    backend.init()
    gpm_cpu = 0.0
    real_read = gpm_module.GpmReader.read

    def timed_read(self, *args):  # type: ignore[no-untyped-def]
        nonlocal gpm_cpu
        t0 = time.thread_time()
        try:
            return real_read(self, *args)
        finally:
            gpm_cpu += time.thread_time() - t0

    gpm_module.GpmReader.read = timed_read  # type: ignore[method-assign]
    cursors: dict[str, tuple[int, int]] = {}
    for _ in range(3):  # warm up: first GPM samples, supported/unsupported decided
        backend.read(cursors)
        time.sleep(0.2)
    gpm_cpu = 0.0
    t0 = time.thread_time()
    readings = []
    for _ in range(READS):
        time.sleep(0.005)  # a few driver samples between reads, as between real polls
        readings = backend.read(cursors)
        cursors = {r.uuid: (max((s.timestamp_us for s in r.util_samples or ()),
                                default=cursors.get(r.uuid, (0, 0))[0]),
                            max((s.timestamp_us for s in r.process_samples or ()),
                                default=cursors.get(r.uuid, (0, 0))[1]))
                   for r in readings}
    total = time.thread_time() - t0
    backend.shutdown()
    print(json.dumps({"read_ms": total / READS * 1e3, "gpm_ms": gpm_cpu / READS * 1e3,
                      "with_figures": sum(r.gpm is not None or any(m.gpm for m in r.mig)
                                          for r in readings)}))


def _bookkeeping_us() -> float:
    """CPU µs per GPU per sample of the sampler's GPM arithmetic (no NVML)."""
    from slurm_gpu_exporter.gpu.attribution.activity import DeviceActivity, job_activity, sole_job
    from slurm_gpu_exporter.gpu.attribution.counters import JobGpuCounters
    from slurm_gpu_exporter.gpu.readings import GpmFigures

    figures = GpmFigures(5.0, {"sm_active": 0.25, "sm_occupancy": 0.3, "tensor_active": 0.1,
                               "dram_active": 0.4, "fp64_active": 0.0, "fp32_active": 0.2,
                               "fp16_active": 0.05},
                         {"pcie_transmit": 1e9, "pcie_receive": 2e8, "nvlink_receive": 0.0,
                          "nvlink_transmit": 0.0})
    totals, counter, n = DeviceActivity(), JobGpuCounters(gpu="0"), 20_000
    t0 = time.thread_time()
    for i in range(n):
        totals.add(f"GPU-{i % GPUS}", figures)
        if sole_job({"7"}, False):
            counter.add_activity(job_activity(figures, 0.0, 1e9))
        totals.of(f"GPU-{i % GPUS}")
    return (time.thread_time() - t0) / n * 1e6


def main() -> None:
    from common import record

    from tests.fakenvml import fake_nvml_or_skip

    figures: dict[str, object] = {"gpus": GPUS, "reads": READS}
    with tempfile.TemporaryDirectory() as tmp:
        for label, gpm, mig in (("no_gpm", False, False), ("gpm", True, False),
                                ("gpm_mig7", True, True)):  # fmt: skip
            fake = fake_nvml_or_skip(Path(tmp) / label)
            fake.write(_node(gpm, mig))  # type: ignore[arg-type]
            out = subprocess.run([sys.executable, __file__, "--child"], env=fake.env(),
                                 capture_output=True, text=True, check=True, cwd=ROOT)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            figures[f"{label}_read_cpu_ms_per_sample"] = round(got["read_ms"], 3)
            figures[f"{label}_gpm_cpu_ms_per_gpu_per_sample"] = round(got["gpm_ms"] / GPUS, 4)
            figures[f"{label}_gpus_with_figures"] = got["with_figures"]
    added = (figures["gpm_read_cpu_ms_per_sample"]  # type: ignore[operator]
             - figures["no_gpm_read_cpu_ms_per_sample"]) / GPUS
    figures["gpm_added_read_cpu_ms_per_gpu_per_sample"] = round(added, 4)
    figures["sampler_bookkeeping_cpu_us_per_gpu_per_sample"] = round(_bookkeeping_us(), 2)
    figures["budget_ms_per_gpu_per_sample"] = 1.0
    record("gpm", figures)


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        os.environ.setdefault("PYTHONHASHSEED", "0")
        _child()
    else:
        main()
