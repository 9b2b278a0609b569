"""The Prometheus rule files: valid, generated from the thresholds, and unit-tested."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.daemons import DEPLOY, tool

pytestmark = pytest.mark.prometheus

PROM = DEPLOY / "prometheus"
GENERATOR = PROM / "alerting" / "generate_alerts.py"
ALERTS = PROM / "rules" / "slurm-gpu-exporter.alerts.yml"
RULE_TEST = PROM / "rule-tests" / "slurm-gpu-exporter.test.yml"


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(GENERATOR), *args], capture_output=True,
                          text=True, timeout=30, check=False)


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool", package="prometheus"), *args], capture_output=True,
                          text=True, timeout=60, check=False, cwd=cwd)


def copy_for_rule_test(tmp_path: Path) -> Path:
    """deploy/prometheus's rules and rule tests in a scratch tree; returns the test file."""
    for sub in ("rules", "rule-tests"):
        shutil.copytree(PROM / sub, tmp_path / sub)
    return tmp_path / "rule-tests" / RULE_TEST.name


def test_committed_alert_rules_are_what_the_generator_writes(tmp_path: Path) -> None:
    result = generate("--output", str(tmp_path / "alerts.yml"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "alerts.yml").read_text() == ALERTS.read_text(), (
        "rules/slurm-gpu-exporter.alerts.yml is out of date: run "
        "python3 deploy/prometheus/alerting/generate_alerts.py")


def test_promtool_check_rules_passes() -> None:
    result = promtool("check", "rules", *map(str, sorted((PROM / "rules").glob("*.yml"))))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 14 rules found" in result.stdout  # the alerts


def test_promtool_check_config_passes_on_every_example() -> None:
    for config in ("prometheus.yml", "federation/node-tier.yml", "federation/global-tier.yml"):
        result = promtool("check", "config", "--syntax-only", str(PROM / config))
        assert result.returncode == 0, (config, result.stdout + result.stderr)


def test_promtool_rule_unit_tests_pass() -> None:
    result = promtool("test", "rules", RULE_TEST.name, cwd=RULE_TEST.parent)
    assert result.returncode == 0, result.stdout + result.stderr


# Each threshold moved just past the side its rule tests sit on.
MOVES = [
    "gpu_idle_warning_window=61m", "gpu_idle_critical_window=119m", "gpu_idle_for=1m",
    "job_low_gpu_use_ratio=0.14", "job_low_gpu_use_window=31m", "job_low_gpu_use_for=1m",
    "gpu_temperature_celsius=86", "gpu_temperature_for=6m", "gpu_memory_used_ratio=0.96",
    "gpu_memory_for=11m", "gpu_errors_window=1m", "gpu_unattributed_for=11m",
    "agent_stale_intervals=4", "agent_sample_interval_seconds=6", "agent_down_for=6m",
    "agent_stale_for=3m", "agent_nvml_down_for=6m", "agent_job=other",
    "remediate_refused_window=16m",
    "gpu_xid_reset_codes=79",
]


@pytest.mark.parametrize("moved", MOVES)
def test_moving_any_threshold_breaks_a_rule_unit_test(tmp_path: Path, moved: str) -> None:
    """The rule tests sit on both sides of every threshold, so none can move unseen."""
    test_file = copy_for_rule_test(tmp_path)
    result = generate("--set", moved, "--output", str(tmp_path / "rules" / ALERTS.name))
    assert result.returncode == 0, result.stderr
    result = promtool("test", "rules", test_file.name, cwd=test_file.parent)
    assert result.returncode != 0, f"{moved}: the rule tests still pass\n{result.stdout}"


def test_every_threshold_is_covered_by_the_moves_above() -> None:
    names = set(yaml.safe_load((PROM / "alerting" / "thresholds.yml").read_text()))
    assert names == {move.split("=")[0] for move in MOVES}


def test_generator_refuses_unknown_or_malformed_thresholds(tmp_path: Path) -> None:
    result = generate("--set", "no_such=1", "--output", "-")
    assert result.returncode == 1
    assert result.stderr.startswith("generate_alerts: --set no_such")
    assert "Traceback" not in result.stderr
    bad = tmp_path / "thresholds.yml"
    bad.write_text("- not\n- a mapping\n")
    result = generate("--thresholds", str(bad), "--output", "-")
    assert result.returncode == 1 and "expected a mapping" in result.stderr
    partial = tmp_path / "partial.yml"
    partial.write_text("gpu_idle_for: 0m\n")
    result = generate("--thresholds", str(partial), "--output", "-")
    assert result.returncode == 1 and "which thresholds.yml lacks" in result.stderr
    result = generate("--set", 'gpu_idle_for=1m"', "--output", "-")
    assert result.returncode == 1 and "not a plain value" in result.stderr
