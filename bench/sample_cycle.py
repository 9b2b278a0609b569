"""CPU time of one sample on the simulated node (8 GPUs), by source.

The simulated GPU backend stands in for NVML; its time is reported apart, since the
budget excludes the driver's time.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import percentile, record

from slurm_gpu_exporter.exposition.rendered import render
from slurm_gpu_exporter.gpu.simulated import SimulatedBackend
from slurm_gpu_exporter.gpu.source import GpuSampler
from slurm_gpu_exporter.jobs.stats import JobStatsCollector
from slurm_gpu_exporter.jobs.tracker import JobTracker
from slurm_gpu_exporter.node.cgroup import CgroupFS
from slurm_gpu_exporter.node.slurm.lookup import SlurmMetadata
from slurm_gpu_exporter.node.source_health import SourceErrors
from slurm_gpu_exporter.node.state_dir import StateStore
from slurm_gpu_exporter.sampling.sampler import Sampler
from slurm_gpu_exporter.sim.simulate import SimulatedNode

CYCLES = 60


class TimedBackend(SimulatedBackend):
    """The simulated backend, with the CPU time it spends counted apart."""

    cpu = 0.0

    def read(self, cursors):  # type: ignore[no-untyped-def]
        t0 = time.thread_time()
        try:
            return super().read(cursors)
        finally:
            TimedBackend.cpu += time.thread_time() - t0


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        node = SimulatedNode(Path(tmp))
        errors = SourceErrors()
        cgroups = CgroupFS(node.cgroup_root)
        metadata = SlurmMetadata(node.slurm_lookup, errors=errors)
        tracker = JobTracker(str(node.spool_dir), cgroups, metadata, errors,
                              proc_root=node.proc_root, trusted_uids=frozenset({0, os.geteuid()}))
        backend = TimedBackend(node.gpu_count, node.gpu_processes)
        gpu = GpuSampler(backend, node.proc_root, errors, cgroups=cgroups)
        sampler = Sampler([tracker, JobStatsCollector(cgroups, node.proc_root, errors), gpu],
                          errors, 1.0, state=StateStore(node.state_dir))
        sampler.sample_once()  # warm caches, first GPU look
        cpu, nvml, render_cpu = [], [], []
        snapshot = None
        for _ in range(CYCLES):
            time.sleep(0.2)
            TimedBackend.cpu = 0.0
            t0 = time.process_time()
            snapshot = sampler.sample_once()
            total = time.process_time() - t0
            nvml.append(TimedBackend.cpu * 1000)
            cpu.append((total - TimedBackend.cpu) * 1000)
            t1 = time.process_time()
            # What Prometheus' first scrape of the snapshot costs (not part of the cycle:
            # publishing renders nothing).
            render(snapshot).openmetrics_gzip  # noqa: B018
            render_cpu.append((time.process_time() - t1) * 1000)
        gpu.close()
    assert snapshot is not None
    record("sample_cycle", {
        "node": f"{len(snapshot.jobs)} jobs, {len(snapshot.gpus)} GPUs (simulated)",
        "cycle_cpu_ms_p50_excl_gpu_backend": round(percentile(cpu, 50), 2),
        "cycle_cpu_ms_p99_excl_gpu_backend": round(percentile(cpu, 99), 2),
        "first_scrape_render_cpu_ms_p50_openmetrics_gzip": round(percentile(render_cpu, 50), 2),
        "simulated_backend_cpu_ms_p50": round(percentile(nvml, 50), 2),
        "exposition_bytes": len(render(snapshot).text),
    })


if __name__ == "__main__":
    main()
