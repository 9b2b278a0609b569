"""Behaviour that mutants of report/mlflow survived in the fast tier (bench/mutation.py,
issue 55): each test here fails on the mutant it names."""

from __future__ import annotations

from slurm_gpu_exporter.report.figures.shapes import GpuDetail, JobDetail, JobUsage, NodeDetail
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.mlflow.named import named_runs
from slurm_gpu_exporter.report.mlflow.runs import PendingRun, verdict
from slurm_gpu_exporter.report.prometheus.client import Sample

WINDOW = Window(10_000.0, 20_000.0)
NOW = 20_000.0
# Job 4242's agent (alice's) named run a…a in experiment 1.
NAMED = named_runs([
    Sample({"jobid": "4242", "user": "alice", "run_id": "a" * 32, "experiment_id": "1"}, 1),
])


def _ended_job() -> JobDetail:
    usage = JobUsage(jobid="4242", user="alice", gpus=1, allocated_s=3600.0, busy_s=1800.0,
                     start=8_000.0, end=15_000.0, gpu_memory_peak=2.0**30)
    return JobDetail(usage, [NodeDetail("n1", gpus=[GpuDetail("0", "GPU-0", 3600.0, 1800.0)])],
                     None, now=NOW)


def test_a_named_run_moved_to_another_experiment_is_refused():
    """mutmut: runs._linked's experiment check answering "REFUSE" or no reason."""
    moved = PendingRun("a" * 32, "2", "alice", "4242", "", start_s=9_000.0)
    said = verdict(moved, NAMED, _ended_job(), WINDOW, NOW)
    assert (said.action, said.why) == (
        "refuse", "the run is in experiment 2, the agent named it in experiment 1")


def test_a_run_info_sample_without_a_run_id_names_no_run():
    """mutmut: named_runs reading a missing run_id as a non-empty default."""
    named = named_runs([Sample({"jobid": "4242", "user": "alice", "experiment_id": "1"}, 1)])
    assert named.by_run == {} and named.jobs == frozenset()
