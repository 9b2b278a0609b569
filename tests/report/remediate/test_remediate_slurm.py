"""``slurm-gpu-report remediate`` fed by a real Alertmanager: an Xid that needs a GPU
reset, raised by the fake NVML, goes through the shipped rules and routing, and the
real Slurm node is drained with the alert in its reason; once only; never by a post
without the credentials or with a node name that is not one, and never by alerts
posted straight to Alertmanager's API that Prometheus does not show firing.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml

from tests.fakenvml import XidEvent
from tests.support import free_port, wait_until
from tests.support.agent import Agent
from tests.support.daemons import Alertmanager, Daemon, Prometheus, WebhookReceiver, http_json
from tests.support.rig import Rig, Scrape
from tests.support.slurmcluster import SlurmCluster
from tests.system.observe.conftest import alertmanager_config, generate_alerts

pytestmark = [pytest.mark.process, pytest.mark.slurm, pytest.mark.every_release,
              pytest.mark.fakenvml,
              pytest.mark.prometheus]

REPORT = Path(sys.executable).parent / "slurm-gpu-report"
USER, PASSWORD = "alertmanager", "s3cret-for-the-test"
ALERT = "SlurmGpuXidResetRequired"


@dataclass
class Remediation:
    cluster: SlurmCluster
    stack: Rig  # the agent over the fake NVML, Prometheus with the rules, Alertmanager
    remediate: Daemon
    drained_reason: str
    alerts: Path  # the rule file Prometheus runs
    remediate_argv: list[str]
    started: list[Any]  # stopped by the fixture, last first

    @property
    def agent(self) -> Agent:
        return self.stack.agent

    @property
    def prometheus(self) -> Prometheus:
        return self.stack.prom

    @property
    def alertmanager(self) -> Alertmanager:
        assert self.stack.alertmanager is not None
        return self.stack.alertmanager


def auth_headers() -> dict[str, str]:
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def post(rig: Remediation, payload: Any, auth: bool = True) -> tuple[int, dict[str, Any] | str]:
    headers = {"Content-Type": "application/json", **(auth_headers() if auth else {})}
    request = urllib.request.Request(f"{rig.remediate.url}/alerts", method="POST",
                                     data=json.dumps(payload).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def with_slurm_env(cluster: SlurmCluster) -> list[str]:
    """``env`` execs the command (same PID) with the Slurm client settings."""
    return ["env", *(f"{k}={v}" for k, v in cluster.env.items())]


def node_line(cluster: SlurmCluster) -> str:
    return cluster.run(["scontrol", "-o", "show", "node", cluster.node_name])


def drained(cluster: SlurmCluster) -> bool:
    return "DRAIN" in node_line(cluster).split("State=", 1)[1].split()[0]


def resume(cluster: SlurmCluster) -> None:
    if drained(cluster):
        cluster.run(["scontrol", "update", f"NodeName={cluster.node_name}", "State=RESUME"])


def alerting(remediate_url: str, password_file: Path) -> tuple[dict[str, Any], WebhookReceiver]:
    """The shipped Alertmanager config, its ``remediate`` receiver posting to
    ``remediate_url`` (basic auth), the others to a webhook sink (returned too)."""
    sink = WebhookReceiver()
    config = alertmanager_config(sink)
    for receiver in config["receivers"]:
        if receiver["name"] == "remediate":
            receiver["webhook_configs"] = [{
                "url": f"{remediate_url}/alerts", "send_resolved": False,
                "http_config": {"basic_auth": {"username": USER,
                                               "password_file": str(password_file)}}}]
    return config, sink


def node_scrape(node: str) -> Scrape:
    """The agent scraped every second (timing out at 1 s), its target labelled ``node``:
    the alert names that node."""
    return Scrape("slurm-gpu-exporter", {"node": node}, timeout="1s")


@pytest.fixture(scope="module")
def rig(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[Remediation]:
    began = time.monotonic()
    base = tmp_path_factory.mktemp("remediate")
    web_config = base / "web-config.yml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    web_config.write_text(yaml.safe_dump({"basic_auth_users": {USER: hashed}}))
    password_file = base / "remediate-password"
    password_file.write_text(PASSWORD)
    alerts = base / "alerts.yml"
    generate_alerts(alerts, {"gpu_errors_window": "1m"})
    resume(slurm_cluster)  # a node left drained by someone else would prove nothing
    started: list[Any] = []
    try:
        port = free_port()
        remediate_url = f"http://127.0.0.1:{port}"
        am_config, sink = alerting(remediate_url, password_file)
        started.append(sink)
        # The agent on a spool of its own (no Slurm look-ups) for the cluster's node.
        stack = Rig(base, devices=2, rule_files=[alerts], alertmanager=am_config,
                    scrape=node_scrape(slurm_cluster.node_name))
        started.append(stack)
        prom = stack.prom
        remediate_argv = [
            *with_slurm_env(slurm_cluster), str(REPORT), "remediate",
            "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(web_config),
            "--node-label", "node", "--prometheus-url", prom.url,
            "--state-file", str(base / "remediate-state" / "remediate.json")]
        remediate = Daemon("remediate", remediate_argv, port, base)
        started.append(remediate)
        remediate.wait_ready("/-/healthy")
        prom.wait_for('up{job="slurm-gpu-exporter"} == 1', timeout=30)
        stack.devices[1].xid_events = [XidEvent(seq=1, xid=79)]  # fallen off the bus
        stack.write_nvml()
        wait_until(lambda: drained(slurm_cluster), 60, "remediate to drain the node",
                   poll=0.5, log=remediate.log)
        reason = node_line(slurm_cluster).split("Reason=", 1)[1]
        print(f"remediate rig, Xid to drained node: {time.monotonic() - began:.1f} s")
        yield Remediation(slurm_cluster, stack, remediate, reason, alerts, remediate_argv,
                          started)
    finally:
        for thing in reversed(started):
            thing.stop()
        resume(slurm_cluster)


def firing_payload(rig: Remediation) -> dict[str, Any]:
    """The alert as Alertmanager holds it, in its webhook's shape."""
    alerts = http_json(f"{rig.alertmanager.url}/api/v2/alerts")
    ours = [a for a in alerts if a["labels"]["alertname"] == ALERT]
    assert ours, alerts
    return {"version": "4", "status": "firing", "alerts": [
        {"status": "firing", "labels": a["labels"], "annotations": a["annotations"],
         "startsAt": a["startsAt"], "fingerprint": a["fingerprint"]} for a in ours]}


def active_since(prom: Prometheus) -> float | None:
    """When the alert's firing began, as Prometheus keeps it; None while it is not
    active."""
    found = prom.vector(f'ALERTS_FOR_STATE{{alertname="{ALERT}"}}')
    return float(found[0]["value"][1]) if found else None


def utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def test_xid_alert_from_alertmanager_drains_the_node_naming_the_alert(rig: Remediation) -> None:
    assert ALERT in rig.drained_reason
    assert "xid 79" in rig.drained_reason and "gpu 1" in rig.drained_reason
    since = active_since(rig.prometheus)
    assert since is not None and f" since {utc(since)}" in rig.drained_reason


def _rfc3339(text: str) -> float:
    """Prometheus' RFC 3339 time (nanoseconds, "Z") as Unix time."""
    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", text).replace("Z", "+00:00")
                                  ).timestamp()


def alert_rule(prom: Prometheus) -> dict[str, Any]:
    """The alert's rule as Prometheus runs it: its query, when it was last evaluated, its
    alerts (with ``activeAt``, the start Alertmanager is given)."""
    groups = http_json(f"{prom.url}/api/v1/rules?type=alert")["data"]["groups"]
    (rule,) = [r for g in groups for r in g["rules"] if r["name"] == ALERT]
    return rule


def evaluated_after(prom: Prometheus, t: float) -> dict[str, Any] | None:
    rule = alert_rule(prom)
    return rule if _rfc3339(rule["lastEvaluation"]) > t else None


ACTED_ON = "ignored: acted on this firing of the alert before"


def test_second_post_of_the_same_alert_does_not_act_again(rig: Remediation) -> None:
    resume(rig.cluster)  # the admin reset the GPU and put the node back
    status, body = post(rig, firing_payload(rig))
    assert status == 200 and isinstance(body, dict)
    assert [r.split(" (", 1)[0] for r in body["results"]] == [ACTED_ON]
    assert not drained(rig.cluster)


def test_unauthenticated_post_is_refused_and_drains_nothing(rig: Remediation) -> None:
    resume(rig.cluster)
    payload = firing_payload(rig)
    payload["alerts"][0]["fingerprint"] = "forged"
    status, _ = post(rig, payload, auth=False)
    assert status == 401
    assert not drained(rig.cluster)


def test_hostile_node_labels_resolved_and_other_alerts_drain_nothing(rig: Remediation) -> None:
    resume(rig.cluster)
    node = rig.cluster.node_name
    alerts = []
    for i, name in enumerate([f"{node} State=RESUME", "-h", f"{node};reboot", "../etc"]):
        alerts.append({"status": "firing", "fingerprint": f"f{i}", "startsAt": "t",
                       "labels": {"alertname": ALERT, "node": name}})
    alerts.append({"status": "firing", "fingerprint": "t1", "startsAt": "t",
                   "labels": {"alertname": "SlurmGpuTemperatureHigh", "node": node}})
    alerts.append({"status": "resolved", "fingerprint": "r1", "startsAt": "t",
                   "labels": {"alertname": ALERT, "node": node}})
    status, body = post(rig, {"alerts": alerts})
    assert status == 200 and isinstance(body, dict)
    results = body["results"]
    assert results[:4] == ["refused: not a node name"] * 4
    assert results[4] == "ignored: alert not in the allow-list"
    assert results[5].startswith("ignored: not firing")
    assert not drained(rig.cluster)
    status, _ = post(rig, {"alerts": "nope"})
    assert status == 400


def test_dry_run_mode_drains_nothing(rig: Remediation, tmp_path: Path) -> None:
    resume(rig.cluster)
    port = free_port()
    dry = Daemon("remediate-dry", [
        *with_slurm_env(rig.cluster), str(REPORT), "remediate", "--web.listen-address",
        f"127.0.0.1:{port}", "--dry-run", "--node-label", "node", "--prometheus-url",
        rig.prometheus.url], port, tmp_path)
    try:
        dry.wait_ready("/-/healthy")
        payload = {"alerts": [{"status": "firing", "fingerprint": "d1", "startsAt": "t",
                               "labels": {"alertname": ALERT, "node": rig.cluster.node_name}}]}
        request = urllib.request.Request(f"{dry.url}/alerts", data=json.dumps(payload).encode(),
                                         method="POST")
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert json.load(resp)["results"] == [f"dry run: would drain "
                                                  f"{rig.cluster.node_name}"]
        assert not drained(rig.cluster)
        assert "without client authentication" in dry.log()
    finally:
        dry.stop()


@pytest.mark.host_release  # episodes in Prometheus; the drain itself is tested on every release
def test_missed_scrapes_do_not_make_it_a_new_alert_that_drains_again(rig: Remediation) -> None:
    """The agent stalls (as while it restarts after the GPU reset): its scrapes time out
    and the series go stale, so the alert's condition no longer holds. The rule keeps it
    firing (keep_firing_for), so once the agent is scraped again it is still the alert
    remediate acted on, not a new one, and the admin's resume stands."""
    prom, up = rig.prometheus, 'up{job="slurm-gpu-exporter"}'
    payload = firing_payload(rig)
    before = payload["alerts"][0]["startsAt"]
    post(rig, payload)  # remediate has acted on this alert, whatever came before this test
    resume(rig.cluster)
    (active,) = [a["activeAt"] for a in alert_rule(prom)["alerts"]]
    os.kill(rig.agent.proc.pid, signal.SIGSTOP)
    try:
        prom.wait_for(f"{up} == 0", timeout=30)  # a scrape timed out: the series are stale
        stale = time.time()
        rule = wait_until(lambda: evaluated_after(prom, stale), 30,
                          "the rule evaluated on the stale series")
        assert prom.vector(rule["query"]) == [], "the condition still holds: nothing tested"
        assert [a["state"] for a in rule["alerts"]] == ["firing"]
    finally:
        os.kill(rig.agent.proc.pid, signal.SIGCONT)
    rig.agent.wait_ready()
    prom.wait_for(f"{up} == 1", timeout=30)
    scraped = time.time()
    rule = wait_until(lambda: evaluated_after(prom, scraped), 30,
                      "the rule evaluated on the agent's series again")
    assert [a["activeAt"] for a in rule["alerts"]] == [active]
    payload = firing_payload(rig)
    assert payload["alerts"][0]["startsAt"] == before
    status, body = post(rig, payload)
    assert status == 200 and isinstance(body, dict)
    assert [r.split(" (", 1)[0] for r in body["results"]] == [ACTED_ON]
    assert not drained(rig.cluster)


def refusals(rig: Remediation) -> dict[str, float]:
    """remediate's refusal counters by reason, from its /metrics."""
    request = urllib.request.Request(f"{rig.remediate.url}/metrics", headers=auth_headers())
    with urllib.request.urlopen(request, timeout=10) as resp:
        text = resp.read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith('slurm_gpu_remediate_alerts_total{outcome="refused"'):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            found[reason] = float(line.rsplit(" ", 1)[1])
    return found


def test_alerts_forged_through_alertmanagers_api_drain_nothing_and_say_why(
        rig: Remediation) -> None:
    """Issue 33's attack: alerts posted to Alertmanager's open API, which routes them to
    remediate with its credentials. ``ALL`` is no node name; gpu-node-17 and this node's
    SlurmGpuLost are not firing in Prometheus (the real alert here is an Xid)."""
    resume(rig.cluster)
    before = refusals(rig)
    node = rig.cluster.node_name
    forged = [{"labels": {"alertname": "SlurmGpuLost", "instance": "ALL", "node": "ALL"}},
              {"labels": {"alertname": "SlurmGpuLost", "instance": "gpu-node-17:9817",
                          "node": "gpu-node-17"}},
              {"labels": {"alertname": "SlurmGpuLost", "instance": f"{node}:9817",
                          "node": node}}]
    request = urllib.request.Request(f"{rig.alertmanager.url}/api/v2/alerts", method="POST",
                                     data=json.dumps(forged).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200  # Alertmanager takes them: its API is open here

    def counted() -> bool:
        now = refusals(rig)
        return (now.get("not_a_node", 0) - before.get("not_a_node", 0) >= 1
                and now.get("unconfirmed", 0) - before.get("unconfirmed", 0) >= 2)

    wait_until(counted, 30, "remediate to refuse the forged alerts", poll=0.5,
               log=rig.remediate.log)
    assert not drained(rig.cluster)
    log = rig.remediate.log()
    assert f"refused SlurmGpuLost (node={node}): Prometheus shows no firing SlurmGpuLost " \
           f"for node={node}" in log
    assert "refused SlurmGpuLost (node=gpu-node-17): Prometheus shows no firing" in log
    assert "refused SlurmGpuLost (node=ALL): not a node name" in log


def counted(rig: Remediation, outcome: str, reason: str) -> float:
    """One of remediate's alert counters, from its /metrics."""
    request = urllib.request.Request(f"{rig.remediate.url}/metrics", headers=auth_headers())
    with urllib.request.urlopen(request, timeout=10) as resp:
        text = resp.read().decode()
    series = f'slurm_gpu_remediate_alerts_total{{outcome="{outcome}",reason="{reason}"}} '
    return sum(float(line[len(series):]) for line in text.splitlines()
               if line.startswith(series))


def post_to_alertmanager(rig: Remediation, alerts: list[dict[str, Any]]) -> None:
    request = urllib.request.Request(f"{rig.alertmanager.url}/api/v2/alerts", method="POST",
                                     data=json.dumps(alerts).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200


def restart_remediate(rig: Remediation) -> None:
    rig.remediate.stop()
    again = Daemon("remediate-restarted", rig.remediate_argv, rig.remediate.port,
                   rig.remediate.log_path.parent)
    rig.started.append(again)
    rig.remediate = again
    again.wait_ready("/-/healthy")


def assert_acted_on_before(rig: Remediation, payload: dict[str, Any]) -> None:
    status, body = post(rig, payload)
    assert not drained(rig.cluster), body
    assert status == 200 and isinstance(body, dict), body
    assert body["results"] and all(r.startswith(ACTED_ON) for r in body["results"]), body


@pytest.mark.host_release  # episodes in Prometheus; the drain itself is tested on every release
def test_a_resumed_node_is_drained_again_only_for_a_new_firing(rig: Remediation) -> None:
    """Issue 42: after the admin resumed the node, posts of the same firing drain
    nothing, whatever their fingerprint, start or extra labels, through remediate's
    restart; once the alert resolved in Prometheus and fires again, it drains."""
    prom, node = rig.prometheus, rig.cluster.node_name
    first = active_since(prom)
    assert first is not None, "the alert no longer fires: nothing tested"
    payload = firing_payload(rig)
    post(rig, payload)  # remediate has acted on this firing, whatever came before
    resume(rig.cluster)  # the admin: scontrol update NodeName=... State=RESUME
    assert not drained(rig.cluster)
    reposted = json.loads(json.dumps(payload))
    for alert in reposted["alerts"]:
        alert["fingerprint"] = "0123456789abcdef"
        alert["startsAt"] = utc(time.time())
        alert["labels"]["poster"] = "someone"
    assert_acted_on_before(rig, payload)
    assert_acted_on_before(rig, reposted)
    # The same alert with one extra label through Alertmanager's open API: a new alert
    # (a new fingerprint) there, routed to remediate with its credentials.
    before = counted(rig, "ignored", "same_episode")
    extra = [{"labels": {**a["labels"], "extra": "1"}} for a in payload["alerts"]]
    post_to_alertmanager(rig, extra)
    wait_until(lambda: counted(rig, "ignored", "same_episode") > before, 30,
               "remediate to get the re-post from Alertmanager", poll=0.5,
               log=rig.remediate.log)
    # Resolved again, so that it cannot keep the group's next notification back.
    post_to_alertmanager(rig, [e | {"endsAt": utc(time.time() - 1)} for e in extra])
    assert not drained(rig.cluster)
    restart_remediate(rig)  # what it acted on is in its state file
    assert_acted_on_before(rig, reposted)
    assert "acted on this firing before" in rig.remediate.log()

    # The fault ends: the rule's keep_firing_for is shortened (5m is too long for a
    # test) and Prometheus reloads it, keeping the alert's state.
    rules = rig.alerts.read_text()
    assert "keep_firing_for: 5m" in rules
    rig.alerts.write_text(rules.replace("keep_firing_for: 5m", "keep_firing_for: 5s"))
    os.kill(prom.proc.pid, signal.SIGHUP)
    wait_until(lambda: active_since(prom) is None, 180,
               "the alert to resolve in Prometheus", poll=1, log=prom.log)
    status, body = post(rig, payload)  # over in Prometheus: nothing to confirm
    assert status == 200 and isinstance(body, dict)
    assert body["results"] == [f"refused: Prometheus shows no firing {ALERT} for "
                               f"node={node}"]
    # A new Xid on the same GPU: the alert fires again, a new firing, from the real
    # rule through Alertmanager.
    rig.stack.devices[1].xid_events.append(XidEvent(seq=2, xid=79))
    rig.stack.write_nvml()
    wait_until(lambda: drained(rig.cluster), 90, "remediate to drain for the new firing",
               poll=0.5, log=rig.remediate.log)
    second = active_since(prom)
    assert second is not None and second > first
    assert f" since {utc(second)}" in node_line(rig.cluster).split("Reason=", 1)[1]
