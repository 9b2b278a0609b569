"""Federation and remote write between real Prometheus processes."""

from __future__ import annotations

import pytest

from tests.system.observe.conftest import Stack

pytestmark = pytest.mark.prometheus

RECORDED = "jobid_user:slurm_job_gpu_busy_seconds:rate5m"


def jobs(result: list[dict]) -> set[str]:
    return {s["metric"]["jobid"] for s in result}


def test_global_tier_gets_recorded_series_with_cluster_and_not_raw_ones(stack: Stack) -> None:
    node_jobs = jobs(stack.node.wait_for(RECORDED))
    federated = stack.global_tier.wait_for(RECORDED, min_results=len(node_jobs))
    assert jobs(federated) == node_jobs
    for series in federated:
        assert series["metric"]["cluster"] == stack.cluster
        assert series["metric"]["prometheus_shard"]  # the node tier's external label
        assert series["metric"]["user"]
    for name in ("user:slurm_job_gpu_busy:ratio_rate5m", "cluster:slurm_gpus:count",
                 "account:slurm_job_gpu_allocated_seconds:rate5m", "jobid:slurm_job_info:max"):
        assert stack.global_tier.wait_for(name), name
    # Raw per-GPU and per-job series stay in the node tier.
    for raw in ("slurm_job_gpu_busy_seconds_total", "slurm_job_info", "slurm_gpu_info",
                "slurm_gpu_power_watts", "slurm_job_cpu_seconds_total"):
        assert stack.node.vector(raw), raw
        assert stack.global_tier.vector(raw) == [], f"{raw} travelled to the global tier"


def test_global_tier_recomputes_a_ratio_from_federated_parts(stack: Stack) -> None:
    stack.global_tier.wait_for("cluster:slurm_job_gpu_busy_seconds:rate5m")
    expr = ("sum by (cluster) (cluster:slurm_job_gpu_busy_seconds:rate5m)"
            " / sum by (cluster) (cluster:slurm_job_gpu_allocated_measured_seconds:rate5m)")
    (result,) = stack.global_tier.wait_for(expr)
    assert 0 < float(result["value"][1]) < 1


def test_remote_write_receiver_answers_the_same_query(stack: Stack) -> None:
    node_jobs = jobs(stack.node.wait_for(RECORDED))
    received = stack.receiver.wait_for(RECORDED, min_results=len(node_jobs))
    assert jobs(received) == node_jobs
    assert {s["metric"]["cluster"] for s in received} == {stack.cluster}
    assert stack.receiver.wait_for("slurm_job_info")  # kept by write_relabel_configs
    assert stack.receiver.vector("slurm_job_gpu_busy_seconds_total") == []
