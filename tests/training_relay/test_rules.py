"""The training alert rules, checked and unit-tested by Debian's promtool."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support import REPO, require

PROM = REPO / "deploy" / "prometheus"

pytestmark = pytest.mark.prometheus


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    require(promtool is not None, "promtool (Debian package prometheus) is not installed")
    return subprocess.run([promtool, *args], cwd=PROM, capture_output=True, text=True,
                          timeout=60)


def test_training_rules_are_valid():
    result = _promtool("check", "rules", "rules/training.rules.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_training_alerts_fire_on_one_side_of_each_threshold_only():
    result = _promtool("test", "rules", "rule-tests/training.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
