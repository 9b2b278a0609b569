"""An idle GPU (no job holds it, no process uses it) takes the attribution's idle path:
every exported value and the saved state are those the full path gives."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu_exporter.gpu.readings import GpuProcess
from slurm_gpu_exporter.gpu.source import GpuPartResult, GpuSampler
from slurm_gpu_exporter.jobs.job import Job
from slurm_gpu_exporter.node.source_health import SourceErrors
from tests.gpu.fake_gpu import T0, FakeBackend, StubMapper


def make(tmp_path: Path) -> tuple[FakeBackend, GpuSampler]:
    backend = FakeBackend()
    backend.sm_active = 0.0
    backend.violations_ns = {"power": 0}
    backend.throttling = {"power": 0.25}
    sampler = GpuSampler(backend, tmp_path, SourceErrors())
    sampler.mapper = StubMapper({4242: "8"})  # type: ignore[assignment]
    return backend, sampler


@pytest.fixture
def pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
         ) -> Iterator[tuple[tuple[FakeBackend, GpuSampler], tuple[FakeBackend, GpuSampler]]]:
    fast, full = make(tmp_path), make(tmp_path)
    # The reference takes the full path for every GPU.
    monkeypatch.setattr(full[1].attribution, "idle_check", lambda *a: False)
    yield fast, full
    fast[1].close()
    full[1].close()


def run(backend: FakeBackend, sampler: GpuSampler, jobs: list[Job]) -> GpuPartResult:
    backend.advance(5.0)
    return sampler.sample(jobs, backend.t)


@pytest.mark.parametrize("no_samples", [True, False], ids=["not_found", "sampling"])
def test_an_idle_gpu_exports_what_the_full_path_gives(pair, no_samples: bool) -> None:  # type: ignore[no-untyped-def]
    other = Job(jobid="7", uid=1000, user="alice", job_gpus="1", start_time=T0 - 60.0)
    mine = Job(jobid="8", uid=1000, user="alice", job_gpus="0", start_time=T0 + 30.0)
    steps: list[tuple[list[Job], tuple[GpuProcess, ...]]] = [
        ([], ()), ([], ()), ([other], ()),  # idle, then a job on another GPU
        ([other], (GpuProcess(4242, 1 << 20),)),  # a process outside every job
        ([other, mine], (GpuProcess(4242, 1 << 20),)),  # held and used
        ([other], ()), ([], ()), ([], ()),  # idle again
    ]
    for backend, _ in pair:
        backend.no_samples = no_samples
    idle_seen = []
    for jobs, procs in steps:
        parts = []
        for backend, sampler in pair:
            backend.processes = procs
            parts.append(run(backend, sampler, jobs))
        assert parts[0] == parts[1]
        assert pair[0][1].export_state() == pair[1][1].export_state()
        idle_seen.append(pair[0][1].attribution.idle_polls)
    # Taken for the idle samples only, and never by the reference.
    assert idle_seen == [1, 2, 3, 3, 3, 4, 5, 6]
    assert pair[1][1].attribution.idle_polls == 0
