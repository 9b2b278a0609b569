"""deploy/alertmanager: the config is valid and routes each kind of alert where it says."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.daemons import DEPLOY, tool

pytestmark = pytest.mark.prometheus

CONFIG = DEPLOY / "alertmanager" / "alertmanager.yml"
CASES = yaml.safe_load((DEPLOY / "alertmanager" / "routes-tests.yml").read_text())


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("amtool", package="prometheus-alertmanager"), *args],
                          capture_output=True, text=True, timeout=30, check=False)


def test_amtool_check_config_passes() -> None:
    result = amtool("check-config", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c["labels"].values()))
def test_alerts_are_routed_to_their_receivers(case: dict) -> None:
    labels = [f"{k}={v}" for k, v in case["labels"].items()]
    receivers = ",".join(case["receivers"])
    result = amtool("config", "routes", "test", f"--config.file={CONFIG}",
                    f"--verify.receivers={receivers}", *labels)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_receiver_fails_the_route_test() -> None:
    result = amtool("config", "routes", "test", f"--config.file={CONFIG}",
                    "--verify.receivers=ops-email", "audience=user", "severity=warning")
    assert result.returncode != 0


def test_every_receiver_is_reached_by_some_case() -> None:
    names = {r["name"] for r in yaml.safe_load(CONFIG.read_text())["receivers"]}
    assert names == {r for case in CASES for r in case["receivers"]}
