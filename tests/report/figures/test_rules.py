"""Notes are declared rules: each default fires just past its threshold and not before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.rules import (
    job_facts,
    load_config,
    notes_for,
    render_template,
)
from slurm_gpu_exporter.report.figures.shapes import (
    Accounting,
    GpuDetail,
    JobDetail,
    JobUsage,
    NodeDetail,
)

CONFIG = load_config(None)
EPS = 1e-6

# A job that deserves no note at all.
CLEAN: dict[str, Any] = {
    "jobid": "7", "user": "alice", "gpus": 2, "gpu_hours": 10.0, "gpu_busy_ratio": 0.9,
    "idle_gpus": 0, "used_gpus": 2, "gpu_memory_peak_gib": 40.0, "memory_peak_gib": 50.0,
    "memory_request_gib": 60.0, "cpu_efficiency": 0.9, "cpus": 8, "finished": 1,
    "memory_used_ratio": 0.9, "suggested_memory_gib": 60, "time_used_ratio": 0.5,
    "runtime_s": 3600.0, "runtime": "01:00:00", "time_limit": "02:00:00",
    "suggested_time": "01:12:00",
}


def fired(**changes: Any) -> set[str]:
    facts = {**CLEAN, **changes}
    return {rule.name for rule in CONFIG.notes if rule.applies(facts)}


def test_a_clean_job_gets_no_note() -> None:
    assert fired() == set()
    assert notes_for(CLEAN, CONFIG.notes) == []


@pytest.mark.parametrize(("name", "below", "above"), [
    # (rule, facts just below its threshold, facts just above it)
    ("too-short", {"runtime_s": 300 - EPS}, {"runtime_s": 300}),
    ("low-gpu-utilization", {"gpu_busy_ratio": 0.15 - EPS}, {"gpu_busy_ratio": 0.15}),
    ("low-cpu-efficiency", {"cpu_efficiency": 0.65 - EPS}, {"cpu_efficiency": 0.65}),
    ("memory-overrequested", {"memory_used_ratio": 0.70 - EPS}, {"memory_used_ratio": 0.70}),
    ("time-overrequested", {"time_used_ratio": 0.10 - EPS}, {"time_used_ratio": 0.10}),
])
def test_under_threshold_rules(name: str, below: dict[str, Any], above: dict[str, Any]) -> None:
    assert name in fired(**below)
    assert name not in fired(**above)


MIG = {"gpus": 1, "used_gpus": 1, "gpu_busy_ratio": 0.15, "gpu_memory_peak_gib": 10.0,
       "memory_peak_gib": 32.0}


@pytest.mark.parametrize(("fact", "over"), [
    ("gpu_busy_ratio", 0.15 + EPS), ("gpu_memory_peak_gib", 10 + EPS),
    ("memory_peak_gib", 32 + EPS), ("gpus", 2),
])
def test_mig_eligible_at_each_limit_and_not_past_it(fact: str, over: float) -> None:
    assert "mig-eligible" in fired(**MIG)  # exactly at every limit: eligible
    assert "mig-eligible" not in fired(**{**MIG, fact: over})


def test_gpu_never_used_only_at_zero() -> None:
    assert "gpu-never-used" in fired(gpu_busy_ratio=0.0)
    assert "gpu-never-used" not in fired(gpu_busy_ratio=EPS)
    assert "low-gpu-utilization" in fired(gpu_busy_ratio=EPS)
    assert "low-gpu-utilization" not in fired(gpu_busy_ratio=0.0)


def test_idle_gpus_needs_one_idle_and_one_used() -> None:
    assert "idle-gpus" in fired(idle_gpus=1, used_gpus=1)
    assert "idle-gpus" not in fired(idle_gpus=0, used_gpus=2)
    assert "idle-gpus" not in fired(idle_gpus=2, used_gpus=0)  # that is "never used"


def test_running_jobs_get_no_request_advice() -> None:
    assert fired(finished=0, memory_used_ratio=0.1, time_used_ratio=0.01) == set()


def test_unknown_fact_never_satisfies_a_condition() -> None:
    assert "low-cpu-efficiency" not in fired(cpu_efficiency=None)
    assert "memory-overrequested" not in fired(memory_used_ratio=float("nan"))


def test_stop_rule_hides_later_notes() -> None:
    notes = notes_for({**CLEAN, "runtime_s": 10, "runtime": "00:00:10",
                       "gpu_busy_ratio": 0.0}, CONFIG.notes)
    assert notes == ["The job ran 00:00:10 only: too short to judge its efficiency."]


def test_messages_fill_their_templates() -> None:
    notes = notes_for({**CLEAN, "memory_used_ratio": 0.5, "memory_peak_gib": 30.0,
                       "suggested_memory_gib": 36}, CONFIG.notes)
    assert notes == ["The job used 30.0 GiB of the 60.0 GiB it requested: request less "
                     "memory next time, --mem=36G."]


def test_facts_from_a_job_detail_suggest_mem_and_time_with_headroom() -> None:
    gib = 2**30
    detail = JobDetail(
        usage=JobUsage("9", user="bob", gpus=1, allocated_s=7200, busy_s=0,
                       gpu_memory_peak=2 * gib),
        nodes=[NodeDetail("n1", cpus=4, cpu_s=4 * 7200 * 0.5, memory_peak=10 * gib,
                          gpus=[GpuDetail("0", "GPU-x", 7200, 0)])],
        accounting=Accounting(state="COMPLETED", time_limit_s=86400, requested_memory=64 * gib,
                              start=1000.0, end=8200.0),
        now=10_000.0)
    facts = job_facts(detail, CONFIG)
    assert facts["suggested_memory_gib"] == 12  # 10 GiB + 20 %
    assert facts["suggested_time"] == "02:24:00"  # 2 h + 20 %
    assert facts["cpu_efficiency"] == pytest.approx(0.5)
    names = [r.name for r in CONFIG.notes if r.applies(facts)]
    assert names == ["gpu-never-used", "mig-eligible", "low-cpu-efficiency",
                     "memory-overrequested", "time-overrequested"]


def test_site_config_overrides_disables_and_adds_notes(tmp_path: Path) -> None:
    path = tmp_path / "report.toml"
    path.write_text("""
[low_util]
threshold = 0.4
[[notes]]
name = "low-gpu-utilization"
when = [{fact = "gpu_busy_ratio", op = "<", value = 0.3}]
message = "under 30 %: {gpu_busy_ratio:.0%}"
[[notes]]
name = "low-cpu-efficiency"
enabled = false
[[notes]]
name = "many-gpus"
when = [{fact = "gpus", op = ">=", value = 8}]
message = "{gpus} GPUs"
""")
    config = load_config(str(path))
    assert config.threshold == 0.4
    facts = {**CLEAN, "gpu_busy_ratio": 0.29, "cpu_efficiency": 0.1, "gpus": 8}
    assert notes_for(facts, config.notes) == ["under 30 %: 29%", "8 GPUs"]


@pytest.mark.parametrize("text", [
    '[[notes]]\nname = "x"\nwhen = [{fact = "gpus", op = "~", value = 1}]\nmessage = "m"\n',
    '[[notes]]\nname = "x"\nwhen = []\nmessage = "m"\n',
    '[[notes]]\nname = "x"\nwhen = [{fact = "gpus", op = "<", value = 1}]\nmessage = "{a"\n',
    "[low_util]\nthreshold = 2\n",
    "not toml [",
])
def test_bad_config_is_one_clear_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ReportError):
        load_config(str(path))


def test_templates_cannot_reach_attributes() -> None:
    with pytest.raises(ReportError, match="plain fact name"):
        render_template("{user.__class__}", {"user": "alice"})
    with pytest.raises(ReportError, match="unknown fact"):
        render_template("{nope}", {"user": "alice"})


def test_every_job_figure_of_the_table_is_a_fact_a_note_can_test(tmp_path: Path) -> None:
    # The facts take the table's figures under their JSON keys (GiB, kWh) and the GPM
    # activities as shares, so a site's note can test any of them.
    gib, kwh = 2**30, 3.6e6
    gpu = GpuDetail("0", "GPU-x", allocated_s=7200, busy_s=7000, energy_j=0.5 * kwh,
                    sm_active_s=3600, tensor_active_s=360)
    detail = JobDetail(
        usage=JobUsage("9", user="bob", gpus=1, allocated_s=7200, busy_s=7000,
                       gpu_memory_peak=6 * gib, gpm_allocated_s=7200, sm_active_s=3600,
                       tensor_active_s=360),
        nodes=[NodeDetail("n1", cpus=4, memory_peak=3 * gib, cpu_energy_j=0.25 * kwh,
                          gpus=[gpu]),
               NodeDetail("n2", cpus=4, memory_peak=1 * gib)],
        accounting=None, now=10_000.0)
    facts = job_facts(detail, CONFIG)
    assert facts["gpu_memory_peak_gib"] == 6.0
    assert facts["memory_peak_gib"] == 4.0  # both nodes
    assert facts["energy_kwh"] == 0.5
    assert facts["cpu_energy_kwh"] == 0.25
    assert facts["sm_active_ratio"] == 0.5
    assert facts["tensor_active_ratio"] == 0.05
    assert facts["dram_active_ratio"] is None  # not measured: no share, never 0
    path = tmp_path / "report.toml"
    path.write_text("""
[[notes]]
name = "tensor-cores-idle"
when = [{fact = "sm_active_ratio", op = ">=", value = 0.3},
        {fact = "tensor_active_ratio", op = "<", value = 0.1}]
message = "SM {sm_active_ratio:.0%} busy, tensor cores {tensor_active_ratio:.0%}"
""")
    config = load_config(str(path))
    assert "SM 50% busy, tensor cores 5%" in notes_for(facts, config.notes)


@pytest.mark.parametrize(("value", "holds"), [
    (0, True), (0.5, True), (-3, True),
    (None, False), ("0", False), (True, False), (False, False), (float("nan"), False),
])
def test_a_condition_holds_only_for_a_number(value: Any, holds: bool) -> None:
    # Unknown (None), text, a bool (an int in Python) and NaN never satisfy a condition,
    # whichever way it compares.
    from slurm_gpu_exporter.report.figures.rules import Condition

    assert Condition("x", "<", 1.0).holds({"x": value}) is holds
    assert Condition("x", ">=", -5.0).holds({"x": value}) is holds
    assert Condition("x", "!=", 7.0).holds({"x": value}) is holds  # NaN != 7 is True
