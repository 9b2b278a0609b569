"""Per-job CPU and memory figures: floors, requeues, restarts and ended jobs."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_gpu_exporter.jobs.job import Job
from slurm_gpu_exporter.jobs.stats import RESTORED_FLOOR_SAMPLES, JobStatsCollector
from slurm_gpu_exporter.node.cgroup import CgroupFS
from slurm_gpu_exporter.node.source_health import SourceErrors
from tests.support import FIXTURES

LAYOUTS = FIXTURES / "cgroup-layouts"
USAGE_S = 123.456789012  # cpuacct.usage of job 101 in the v1-slurm layout


class Node:
    """A writable copy of the v1-slurm layout (job 101 with cpuacct) and an empty /proc."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "cgroup"
        shutil.copytree(LAYOUTS / "v1-slurm", self.root)
        self.proc = tmp_path / "proc"
        self.proc.mkdir()
        self.cgroups = CgroupFS(self.root)
        self.errors = SourceErrors()

    def job_dir(self, ctrl: str) -> Path:
        return self.root / ctrl / "slurm" / "uid_1000" / "job_101"

    def set_cpu(self, seconds: float) -> None:
        (self.job_dir("cpuacct") / "cpuacct.usage").write_text(f"{int(seconds * 1e9)}\n")

    def job(self, start_time: float = 1000.0, **changes: object) -> Job:
        cgroup = self.cgroups.find_jobs().get("101")
        job = Job(jobid="101", uid=1000, user="alice", start_time=start_time, cgroup=cgroup)
        return replace(job, **changes)  # type: ignore[arg-type]

    def collector(self) -> JobStatsCollector:
        return JobStatsCollector(self.cgroups, self.proc, self.errors)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_cpu_seconds_come_from_the_job_cgroup(node: Node) -> None:
    (sample,) = node.collector().collect([node.job()])
    assert sample.cpu_seconds == pytest.approx(USAGE_S)
    assert sample.memory_used_bytes is not None and sample.memory_used_bytes > 0


def test_requeued_run_of_a_job_counts_from_its_own_start(node: Node) -> None:
    # The job is requeued onto this node: same id, a new start time, a new cgroup whose
    # counter starts again at 0. Its CPU time must grow from 0, not stay flat at the
    # first run's total until it passes it.
    collector = node.collector()
    node.set_cpu(500.0)
    collector.collect([node.job(start_time=1000.0)])
    node.set_cpu(2.0)
    (sample,) = collector.collect([node.job(start_time=2000.0)])
    assert sample.cpu_seconds == pytest.approx(2.0)
    node.set_cpu(3.0)
    (sample,) = collector.collect([node.job(start_time=2000.0)])
    assert sample.cpu_seconds == pytest.approx(3.0)


def test_counter_never_goes_down_within_one_run(node: Node) -> None:
    collector = node.collector()
    node.set_cpu(50.0)
    collector.collect([node.job()])
    node.set_cpu(40.0)  # a cgroup re-created under the same run
    (sample,) = collector.collect([node.job()])
    assert sample.cpu_seconds == pytest.approx(50.0)


def test_restart_restores_the_floor_of_the_same_run_only(node: Node) -> None:
    first = node.collector()
    node.set_cpu(50.0)
    first.collect([node.job(start_time=1000.0)])
    saved = first.export_state()
    assert saved["101"]["start_time"] == 1000.0

    node.set_cpu(10.0)
    same_run = node.collector()
    same_run.import_state(saved)
    assert same_run.collect([node.job(start_time=1000.0)])[0].cpu_seconds == pytest.approx(50.0)

    requeued = node.collector()
    requeued.import_state(saved)
    assert requeued.collect([node.job(start_time=2000.0)])[0].cpu_seconds == pytest.approx(10.0)


def test_restored_floors_of_jobs_never_seen_again_are_pruned(node: Node) -> None:
    collector = node.collector()
    collector.import_state({
        str(jobid): {"start_time": 1000.0, "cpu_seconds": 5.0, "memory_peak_bytes": 7}
        for jobid in range(200, 300)
    })
    for _ in range(RESTORED_FLOOR_SAMPLES):
        collector.collect([node.job()])
    assert list(collector._cpu_floor) == [("101", 1000.0)]
    assert list(collector._peak_floor) in ([], [("101", 1000.0)])
    assert set(collector.export_state()) == {"101"}


def test_restored_floor_applies_to_a_job_found_a_few_samples_after_a_restart(node: Node) -> None:
    collector = node.collector()
    collector.import_state({"101": {"start_time": 1000.0, "cpu_seconds": 500.0}})
    for _ in range(5):
        collector.collect([])  # the registry has not found the job yet
    assert collector.collect([node.job()])[0].cpu_seconds == pytest.approx(500.0)


def test_ended_job_keeps_its_counters_without_the_gauges(node: Node) -> None:
    collector = node.collector()
    (running,) = collector.collect([node.job()])
    (ended,) = collector.collect([node.job(end_time=2000.0, cgroup=None)])
    assert ended.cpu_seconds == running.cpu_seconds
    assert ended.memory_peak_bytes == running.memory_peak_bytes
    assert ended.memory_used_bytes == 0 and ended.processes == 0


def test_vanished_cgroup_keeps_the_counters_seen_so_far(node: Node) -> None:
    collector = node.collector()
    job = node.job()
    (running,) = collector.collect([job])
    for ctrl in job.cgroup.dirs:  # type: ignore[union-attr]
        shutil.rmtree(node.job_dir(ctrl))
    (gone,) = collector.collect([job])
    assert gone.cpu_seconds == running.cpu_seconds
    assert node.errors.snapshot().get("cgroup", 0) == 0


def test_job_without_cpuacct_counts_the_cpu_of_its_processes(node: Node) -> None:
    shutil.rmtree(node.root / "cpuacct")
    # Only the two processes of step 0 still run; the others have exited.
    pids = [5020, 5021]
    for n, pid in enumerate(pids):
        (node.proc / str(pid)).mkdir()
        # utime 300 + stime 100 ticks for each process.
        fields = ["S", "1", "1", "1", "0", "-1", "0", "0", "0", "0", "0", "300", "100",
                  "0", "0", "20", "0", "1", "0", str(1000 + n)]
        (node.proc / str(pid) / "stat").write_text(f"{pid} (burn) {' '.join(fields)}\n")
    collector = JobStatsCollector(CgroupFS(node.root), node.proc, node.errors)
    (sample,) = collector.collect([node.job(cgroup=CgroupFS(node.root).find_jobs()["101"])])
    hz = collector.cpu_from_processes._hz
    assert sample.cpu_seconds == pytest.approx(2 * 400 / hz)


def test_state_saved_without_start_times_still_restores_the_floor(node: Node) -> None:
    collector = node.collector()
    collector.import_state({"101": {"cpu_seconds": 500.0, "memory_peak_bytes": 7}})
    node.set_cpu(10.0)
    assert collector.collect([node.job()])[0].cpu_seconds == pytest.approx(500.0)


@pytest.mark.parametrize("odd", ["²", "0,¹-3", "٣", "0-99999999", "0-1023," * 3])
def test_an_odd_gpu_list_in_one_record_costs_no_other_jobs_figures(node: Node, odd: str) -> None:
    # One record's CUDA_VISIBLE_DEVICES holds a superscript digit (isdigit() says yes,
    # int() raises), a non-ASCII digit or a huge range: the other job keeps its CPU
    # and memory series, nothing is counted as a cgroup error, and the list means no GPUs.
    good = node.job()
    odd_job = node.job(jobid="102", cuda_visible_devices=odd, job_gpus=odd)
    samples = node.collector().collect([odd_job, good])
    assert [s.job.jobid for s in samples] == ["102", "101"]
    assert samples[1].cpu_seconds == pytest.approx(USAGE_S)
    assert samples[0].gpus == 0
    assert node.errors.snapshot()["cgroup"] == 0


class BrokenCgroupFS(CgroupFS):
    """Reading one job's cgroup raises something no reader expects (a bug, say)."""

    def read_stats(self, cgroup):  # type: ignore[no-untyped-def]
        if cgroup.job_key == "102":
            raise RuntimeError("unexpected")
        return super().read_stats(cgroup)


def test_a_fault_in_one_jobs_figures_costs_that_job_alone(node: Node) -> None:
    node.cgroups = BrokenCgroupFS(node.root)
    good = node.job()
    assert good.cgroup is not None
    broken = node.job(jobid="102", job_gpus="0,1",
                      cgroup=replace(good.cgroup, job_key="102"))
    samples = node.collector().collect([broken, good])
    assert [s.job.jobid for s in samples] == ["102", "101"]
    assert samples[1].cpu_seconds == pytest.approx(USAGE_S)
    assert samples[0].cpu_seconds is None and samples[0].gpus == 2, "job stays, figures go"
    assert node.errors.snapshot()["cgroup"] == 1, "counted under the source that failed"
