"""deploy/alertmanager: the config is valid and routes each kind of alert where it says."""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest
import yaml

from tests.support import wait_until
from tests.support.daemons import DEPLOY, Alertmanager, tool

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


WEB_CONFIG = DEPLOY / "alertmanager" / "web-config.yml"


def test_the_shipped_web_config_closes_alertmanagers_api(tmp_path: Path) -> None:
    """deploy/alertmanager/web-config.yml with its placeholder replaced by a real hash:
    a real Alertmanager refuses a post to /api/v2/alerts without the password (the
    forged alert of issue 33) and takes it with the password."""
    web = yaml.safe_load(WEB_CONFIG.read_text())
    assert set(web) == {"basic_auth_users"}
    password = "am-secret-for-the-test"
    web["basic_auth_users"] = {
        "prometheus": bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()}
    (tmp_path / "web.yml").write_text(yaml.safe_dump(web))
    routing = {"route": {"receiver": "none"}, "receivers": [{"name": "none"}]}
    am = Alertmanager(routing, tmp_path / "am",
                      extra_args=(f"--web.config.file={tmp_path / 'web.yml'}",))
    try:
        token = base64.b64encode(f"prometheus:{password}".encode()).decode()
        wait_until(lambda: _status(am.url + "/-/ready", token) == 200, 30,
                   "Alertmanager to be ready", log=am.log)
        forged = json.dumps([{"labels": {"alertname": "SlurmGpuLost", "instance": "ALL"}}])
        assert _status(am.url + "/api/v2/alerts", None, forged) == 401
        assert _status(am.url + "/api/v2/alerts", token, forged) == 200
    finally:
        am.stop()


def _status(url: str, token: str | None, body: str | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Basic {token}"
    request = urllib.request.Request(url, data=body.encode() if body else None,
                                     headers=headers, method="POST" if body else "GET")
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError):
        return 0
