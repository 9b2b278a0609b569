"""One shared stack for the deploy/ tests: the simulated agent, a node-tier Prometheus
(the repo's rules, scrape and remote_write examples), a global tier federating it, a
remote-write receiver, Alertmanager (the repo's routing) and a webhook receiver.

Built from the example files in deploy/ with only addresses and intervals changed, so the
tests check what sites copy. Scrapes and evaluations run every second and the alert
windows are shortened through the same thresholds file sites edit.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support.agent import Agent
from tests.support.daemons import DEPLOY, Alertmanager, Prometheus, WebhookReceiver, tool

GENERATOR = DEPLOY / "prometheus" / "alerting" / "generate_alerts.py"
RECORDING_RULES = DEPLOY / "prometheus" / "rules" / "slurm-gpu-exporter.rules.yml"
# Short windows for a live test. Idle must fire before low-use's `for` ends, so that
# Alertmanager's inhibition (low-use muted while idle fires for the job) is exercised.
LIVE_THRESHOLDS = {
    "gpu_idle_warning_window": "35s",
    "gpu_idle_for": "0s",
    "job_low_gpu_use_window": "50s",
    "job_low_gpu_use_for": "45s",
    "agent_sample_interval_seconds": "1",
}


@dataclass
class Stack:
    agent: Agent
    node: Prometheus
    global_tier: Prometheus
    receiver: Prometheus
    alertmanager: Alertmanager
    webhook: WebhookReceiver
    started: float
    cluster: str


def generate_alerts(output: Path, overrides: dict[str, str]) -> None:
    sets = [arg for name, value in overrides.items() for arg in ("--set", f"{name}={value}")]
    subprocess.run([sys.executable, str(GENERATOR), "--output", str(output), *sets],
                   check=True, timeout=30)


def node_tier_config(agent: Agent, alerts: Path, alertmanager: str, receiver: str) -> dict:
    config = yaml.safe_load((DEPLOY / "prometheus" / "federation" / "node-tier.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(RECORDING_RULES), str(alerts)]
    config["alerting"]["alertmanagers"][0]["static_configs"] = [{"targets": [alertmanager]}]
    (scrape,) = config["scrape_configs"]
    scrape["scrape_timeout"] = "1s"
    scrape["static_configs"][0]["targets"] = [f"127.0.0.1:{agent.port}"]
    (remote,) = config["remote_write"]
    remote["url"] = f"{receiver}/api/v1/write"
    remote["queue_config"] = {"batch_send_deadline": "1s"}
    return config


def global_tier_config(node: Prometheus) -> dict:
    config = yaml.safe_load((DEPLOY / "prometheus" / "federation" / "global-tier.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    (scrape,) = config["scrape_configs"]
    scrape["scrape_timeout"] = "1s"
    scrape["static_configs"] = [{"targets": [f"127.0.0.1:{node.port}"]}]
    return config


def alertmanager_config(webhook: WebhookReceiver) -> dict:
    """The repo's routing and inhibition; every receiver posts to the test's webhook."""
    config = yaml.safe_load((DEPLOY / "alertmanager" / "alertmanager.yml").read_text())
    config["global"] = {"resolve_timeout": "5m"}
    config["receivers"] = [
        {"name": r["name"], "webhook_configs": [{"url": f"{webhook.url}/{r['name']}"}]}
        for r in config["receivers"]]

    def quicken(route: dict) -> None:
        route.update(group_wait="1s", group_interval="1s")
        for child in route.get("routes", []):
            quicken(child)

    quicken(config["route"])
    return config


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tool("prometheus", package="prometheus")
    tool("prometheus-alertmanager", "alertmanager", package="prometheus-alertmanager")
    base = tmp_path_factory.mktemp("observe")
    alerts = base / "alerts.yml"
    generate_alerts(alerts, LIVE_THRESHOLDS)
    started: list = []
    try:
        agent = Agent(["--simulate", "--sample-interval", "1"], log_path=base / "agent.log")
        started.append(agent)
        webhook = WebhookReceiver()
        started.append(webhook)
        am = Alertmanager(alertmanager_config(webhook), base / "alertmanager")
        started.append(am)
        receiver = Prometheus("receiver", {"global": {"scrape_interval": "1s"}},
                              base / "receiver", ("--web.enable-remote-write-receiver",))
        started.append(receiver)
        node = Prometheus("node-tier", node_tier_config(agent, alerts, f"127.0.0.1:{am.port}",
                                                        receiver.url), base / "node")
        started.append(node)
        global_tier = Prometheus("global-tier", global_tier_config(node), base / "global")
        started.append(global_tier)
        agent.wait_ready()
        for daemon in (am, receiver, node, global_tier):
            daemon.wait_ready()
        cluster = node_tier_config(agent, alerts, "", "")["global"]["external_labels"]["cluster"]
        yield Stack(agent, node, global_tier, receiver, am, webhook, time.time(), cluster)
    finally:
        for thing in reversed(started):
            thing.stop()
