"""What admins read names Slurm nodes, also where Prometheus scrapes agents by address.

Two simulated nodes (``gpu00000``, ``gpu00001``), each its own target ``127.0.0.1:PORT``,
scraped by one Prometheus with the shipped recording and alert rules. The second
target's ``slurm_gpu_exporter_node_info`` is dropped at the scrape: an agent too old to
publish it. The dashboards offer and show the first by its Slurm name and the second by
its target (never left out); a GPU alert on each names them the same way. A second
Prometheus loads no rules (no node map): the panels still show every series, by target.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support import wait_until
from tests.support.daemons import DEPLOY, Prometheus, http_json
from tests.system.observe import grafana
from tests.system.observe.conftest import RECORDING_RULES, generate_alerts
from tests.system.observe.topology import FleetProcess

pytestmark = [pytest.mark.process, pytest.mark.prometheus]

DASHBOARDS = DEPLOY / "grafana" / "dashboards"
CLUSTER = "simfleet"
NAMED = "gpu00000"
NODE_MAP = "instance:slurm_gpu_exporter_node_info:last1h"
# Every GPU of the fleet (40-70 °C) is "hot" at once: an alert on each target.
HOT = {"gpu_temperature_celsius": "30", "gpu_temperature_for": "0s"}


@dataclass
class Fleet:
    prom: Prometheus
    bare: Prometheus  # the same scrapes, no rules
    named: str  # the target whose agent names its Slurm node (NAMED)
    unnamed: str  # the target whose node name is dropped at the scrape
    started: float


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    base = tmp_path_factory.mktemp("node-names")
    alerts = base / "alerts.yml"
    generate_alerts(alerts, HOT)
    started: list = []
    try:
        nodes = FleetProcess(base / "targets.json",
                             ["--nodes", "2", "--gpus-per-node", "2", "--jobs-per-node", "2",
                              "--sample-interval", "1", "--cluster", CLUSTER])
        started.append(nodes)
        named, unnamed = json.loads(nodes.targets.read_text())[0]["targets"]
        assert named.startswith("127.0.0.1:") and unnamed.startswith("127.0.0.1:")
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RECORDING_RULES), str(alerts)],
            "scrape_configs": [{
                "job_name": "slurm-gpu-exporter", "scrape_timeout": "1s",
                "file_sd_configs": [{"files": [str(nodes.targets)]}],
                "metric_relabel_configs": [{
                    "source_labels": ["__name__", "instance"], "action": "drop",
                    "regex": f"slurm_gpu_exporter_node_info;{re.escape(unnamed)}"}]}]}
        prom = Prometheus("node-names", config, base / "prometheus")
        started.append(prom)
        bare = Prometheus("no-rules", {**config, "rule_files": []}, base / "bare")
        started.append(bare)
        prom.wait_ready()
        bare.wait_ready()
        prom.wait_for(NODE_MAP, timeout=60, min_results=2)
        yield Fleet(prom, bare, named, unnamed, time.time())
    finally:
        for thing in reversed(started):
            thing.stop()


def test_the_fleet_is_scraped_by_address_and_one_agent_names_no_node(fleet: Fleet) -> None:
    infos = fleet.prom.vector("slurm_gpu_exporter_node_info")
    assert [(s["metric"]["instance"], s["metric"]["slurm_node"]) for s in infos] == [
        (fleet.named, NAMED)]
    shown = {s["metric"]["instance"]: s["metric"]["slurm_node"]
             for s in fleet.prom.vector(NODE_MAP)}
    assert shown == {fleet.named: NAMED, fleet.unnamed: fleet.unnamed}


def _ranged(fleet: Fleet) -> tuple[float, float]:
    """A time range with rates in it (a few scrapes after the map was first recorded)."""
    wait_until(lambda: time.time() > fleet.started + 6, 10, "a few scrapes", poll=0.5)
    end = time.time()
    return fleet.started, end


def _legends(fleet: Fleet, target: grafana.Target, values: dict[str, str],
             prom: Prometheus | None = None) -> set[str]:
    start, end = _ranged(fleet)
    return {grafana.legend(target.legend, s["metric"])
            for s in grafana.run(prom or fleet.prom, target, values, start, end)}


def _target(board: dict, panel: str, ref: str = "A") -> grafana.Target:
    (found,) = [t for t in grafana.targets(board) if t.panel == panel and t.ref == ref]
    return found


def test_the_node_dashboard_offers_and_shows_slurm_names_and_an_unnamed_target(
        fleet: Fleet) -> None:
    board = grafana.load(DASHBOARDS / "slurm-gpu-node.json")
    queries = grafana.variable_queries(board)
    values = {"cluster": CLUSTER}
    offered = grafana.resolve_variable(fleet.prom, queries["node"], values)
    assert offered == sorted([NAMED, fleet.unnamed])
    utilization = _target(board, "GPU utilization")
    for node, address in ((NAMED, fleet.named), (fleet.unnamed, fleet.unnamed)):
        picked = {**values, "node": node}
        targets = grafana.resolve_variable(fleet.prom, queries["instance"], picked)
        assert targets == [address], (node, targets)
        picked["instance"] = grafana.multi_value(targets)
        assert _legends(fleet, utilization, picked) == {f"{node} GPU 0", f"{node} GPU 1"}
    both = {**values, "instance": grafana.multi_value([fleet.named, fleet.unnamed])}
    assert _legends(fleet, utilization, both) == {
        f"{n} GPU {g}" for n in (NAMED, fleet.unnamed) for g in "01"}


def test_the_job_dashboard_names_the_node_of_each_job(fleet: Fleet) -> None:
    board = grafana.load(DASHBOARDS / "slurm-gpu-job.json")
    queries, regexes = grafana.variable_queries(board), grafana.variable_regexes(board)
    busy = _target(board, "GPU busy and SM active per GPU")
    jobs = {s["metric"]["instance"]: s["metric"]["jobid"]
            for s in fleet.prom.vector(f'slurm_job_info{{cluster="{CLUSTER}"}}')}
    for node, address in ((NAMED, fleet.named), (fleet.unnamed, fleet.unnamed)):
        values = {"cluster": CLUSTER, "jobid": jobs[address]}
        offered = grafana.resolve_variable(fleet.prom, queries["node"], values,
                                           regexes["node"])
        assert offered == [node], offered
        legends = _legends(fleet, busy, {**values, "node": ".*"})
        assert legends and all(name.startswith(f"{node} GPU ") for name in legends), legends
    picked = {"cluster": CLUSTER, "jobid": jobs[fleet.named], "node": "gpu00001"}
    assert _legends(fleet, busy, picked) == set()  # another node picked: filtered out


def test_exporter_health_lists_every_agent_by_node(fleet: Fleet) -> None:
    board = grafana.load(DASHBOARDS / "slurm-gpu-cluster.json")
    up = _target(board, "Exporter health")
    start, end = _ranged(fleet)
    rows = grafana.run(fleet.prom, up, {"cluster": CLUSTER}, start, end)
    assert {(r["metric"]["slurm_node"], r["metric"]["instance"]) for r in rows} == {
        (NAMED, fleet.named), (fleet.unnamed, fleet.unnamed)}


def test_an_alert_on_a_target_scraped_by_address_names_its_slurm_node(fleet: Fleet) -> None:
    def hot() -> dict[str, list[dict]] | None:
        alerts = http_json(fleet.prom.url + "/api/v1/alerts")["data"]["alerts"]
        firing: dict[str, list[dict]] = {}
        for a in alerts:
            if a["labels"]["alertname"] == "SlurmGpuTemperatureHigh" and a["state"] == "firing":
                firing.setdefault(a["labels"]["instance"], []).append(a)
        return firing if len(firing) == 2 else None

    firing = wait_until(hot, 60, "SlurmGpuTemperatureHigh on both targets", poll=0.5)
    for alert in firing[fleet.named]:
        gpu = alert["labels"]["gpu"]
        assert alert["annotations"]["summary"].startswith(f"GPU {gpu} on {NAMED} at ")
        assert f"on {NAMED} (target {fleet.named}) has been" in alert["annotations"][
            "description"]
    for alert in firing[fleet.unnamed]:  # no node name published: its target
        gpu = alert["labels"]["gpu"]
        assert alert["annotations"]["summary"].startswith(f"GPU {gpu} on {fleet.unnamed} at ")
        assert f"on {fleet.unnamed} has been" in alert["annotations"]["description"]


def test_without_the_node_map_every_series_stays_named_by_its_target(fleet: Fleet) -> None:
    """Rules not loaded (or a time range before they were): nothing is left out."""
    board = grafana.load(DASHBOARDS / "slurm-gpu-job.json")
    busy = _target(board, "GPU busy and SM active per GPU")
    assert fleet.bare.vector(NODE_MAP) == []
    for address in (fleet.named, fleet.unnamed):
        (info, *_) = fleet.bare.wait_for(f'slurm_job_info{{instance="{address}"}}')
        values = {"cluster": CLUSTER, "jobid": info["metric"]["jobid"], "node": ".*"}
        legends = _legends(fleet, busy, values, fleet.bare)
        assert legends and all(n.startswith(f"{address} GPU ") for n in legends), legends
    node = grafana.load(DASHBOARDS / "slurm-gpu-node.json")
    utilization = _target(node, "GPU utilization")
    assert _legends(fleet, utilization, {"cluster": CLUSTER, "instance": ".*"},
                    fleet.bare) == {f"{a} GPU {g}" for a in (fleet.named, fleet.unnamed)
                                    for g in "01"}
