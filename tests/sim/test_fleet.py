"""The fleet simulator: each node serves what the agent renders, and jobs behave."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from slurm_gpu_exporter.exposition.families import GPU_LABELS, JOB_GPU_LABELS
from slurm_gpu_exporter.exposition.rendered import Exposition
from slurm_gpu_exporter.sim.fleet import FleetMix, slot_jobs, snapshot
from slurm_gpu_exporter.sim.fleet_server import Fleet
from tests.exposition.test_golden_exposition import GOLDEN

NOW = 1_790_000_000.0


def _shape(text: str) -> dict[str, set[frozenset[str]]]:
    """Each family's name and the label-name sets its samples carry (process_* left out)."""
    shape: dict[str, set[frozenset[str]]] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("process_"):
            continue
        for sample in family.samples:
            shape.setdefault(sample.name, set()).add(frozenset(sample.labels))
    return shape


def _fleet_shape(mix: FleetMix, nodes: range, now: float) -> dict[str, set[frozenset[str]]]:
    fleet = Fleet(mix)
    shape: dict[str, set[frozenset[str]]] = {}
    for node in nodes:
        for name, labels in _shape(fleet.body(node, now).decode()).items():
            shape.setdefault(name, set()).update(labels)
    return shape


def test_a_fleet_node_serves_the_agents_families_and_labels() -> None:
    """Over a few nodes (GPM GPUs, MIG, a stray process, a lingering job) the fleet
    serves exactly the families and label names of the agent's golden exposition."""
    mix = FleetMix(nodes=40, churn_per_hour=8, mig_share=0.3, linger_s=600, epoch=NOW - 7200)
    golden = _shape((GOLDEN / "exposition.txt").read_text())
    fleet = _fleet_shape(mix, range(40), NOW)
    # The golden node lost no driver samples: it declares these families, with no sample.
    gaps = {"slurm_job_gpu_unknown_seconds_total": {frozenset(JOB_GPU_LABELS)},
            "slurm_gpu_unknown_seconds_total": {frozenset(GPU_LABELS)},
            "slurm_gpu_driver_events_total": {frozenset([*GPU_LABELS, "kind"])}}
    declared = (GOLDEN / "exposition.txt").read_text()
    assert all(f"# TYPE {name} counter" in declared for name in gaps)
    assert {k: v for k, v in fleet.items() if k not in gaps} == golden
    assert {k: v for k, v in fleet.items() if k in gaps} == gaps


def test_a_node_is_the_same_whenever_it_is_built() -> None:
    mix = FleetMix(nodes=4, churn_per_hour=4, epoch=NOW - 3600)
    assert Exposition(snapshot(mix, 2, NOW)).text == Exposition(snapshot(mix, 2, NOW)).text


def test_job_counters_grow_at_a_fixed_busy_share_and_stop_when_the_job_ends() -> None:
    mix = FleetMix(nodes=1, jobs_per_node=4, stop_at=NOW, linger_s=1e9, epoch=NOW - 600)
    before, after, later = (snapshot(mix, 0, t) for t in (NOW - 100, NOW, NOW + 500))
    for a, b in zip(before.job_gpus, after.job_gpus, strict=True):
        assert b.allocated_seconds - a.allocated_seconds == 100
        if a.busy_seconds is not None:
            assert b.busy_seconds is not None
            assert abs(b.busy_seconds / b.allocated_seconds
                       - a.busy_seconds / a.allocated_seconds) < 1e-6
    assert [g.allocated_seconds for g in later.job_gpus] == [
        g.allocated_seconds for g in after.job_gpus]
    assert all(j.job.end_time == NOW for j in later.jobs)


def test_churn_starts_the_configured_number_of_jobs_per_hour() -> None:
    mix = FleetMix(nodes=1, jobs_per_node=8, churn_per_hour=16, linger_s=0, epoch=NOW)
    seen = {j.info.jobid for t in range(0, 7200, 60) for j in slot_jobs(mix, 0, NOW + t)}
    assert 30 <= len(seen) <= 8 + 32


def test_more_jobs_than_gpus_share_them_and_each_job_holds_one() -> None:
    mix = FleetMix(nodes=1, gpus_per_node=8, jobs_per_node=32, epoch=NOW - 60)
    snap = snapshot(mix, 0, NOW)
    assert len(snap.jobs) == 32 and len(snap.job_gpus) == 32
    assert len({g.uuid for g in snap.job_gpus}) == 8
