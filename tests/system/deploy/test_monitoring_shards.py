"""The monitoring role as shard i of n (issue 35's contract), applied for real.

Two monitoring hosts, shard 0 and shard 1 of 2, each written into its own temporary
directory (the role's paths are variables) with the Prometheus part only. promtool
loads each config, and ``promtool check service-discovery`` runs the real Prometheus
discovery and relabelling on it: the 60 GPU nodes of the inventory must fall on exactly
one shard each. Nothing is scraped (no address here is contacted).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support import REPO
from tests.support.daemons import tool
from tests.system.deploy.test_monitoring_role import MonitoringHost

pytestmark = pytest.mark.process

NODES = {f"gpu{n:03d}": {"ansible_host": f"10.1.{n // 200}.{n % 200 + 1}"} for n in range(60)}
STORE = "http://127.0.0.1:8428/api/v1/write"
EXAMPLE = REPO / "deploy" / "prometheus" / "scale-out" / "shard.yml"


def _shard(base: Path, shard: int, **more: object) -> tuple[MonitoringHost, int, str]:
    host = MonitoringHost(base / f"shard{shard}", gpu_nodes=NODES)
    rc, out, _ = host.play("--tags", "prometheus", slurm_gpu_monitoring_shards=2,
                           slurm_gpu_monitoring_shard=shard,
                           slurm_gpu_monitoring_remote_write_url=STORE, **more)
    return host, rc, out


def _kept(config: Path) -> set[str]:
    """The addresses Prometheus keeps after relabelling, as its own discovery says."""
    run = subprocess.run([tool("promtool", package="prometheus"), "check", "service-discovery",
                          "--timeout=10s", str(config), "slurm-gpu-exporter"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    found = json.loads(run.stdout)
    assert len(found) == len(NODES)  # every node discovered, kept or dropped
    return {t["discoveredLabels"]["__address__"] for t in found if t["labels"]}


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[MonitoringHost]:
    tool("promtool", package="prometheus")
    base = tmp_path_factory.mktemp("shards")
    hosts = []
    for i in (0, 1):
        host, rc, out = _shard(base, i)
        assert rc == 0, out[-4000:]
        hosts.append(host)
    return hosts


def test_each_shard_config_loads_in_promtool(shards: list[MonitoringHost]) -> None:
    for host in shards:
        run = subprocess.run(["promtool", "check", "config", str(host.prom_config)],
                             capture_output=True, text=True, timeout=60, check=False)
        assert run.returncode == 0, run.stdout + run.stderr


def test_two_shards_split_the_nodes_none_on_both_none_on_neither(
        shards: list[MonitoringHost]) -> None:
    kept = [_kept(host.prom_config) for host in shards]
    every = {f"{v['ansible_host']}:9817" for v in NODES.values()}
    assert kept[0] & kept[1] == set()
    assert kept[0] | kept[1] == every
    assert all(len(k) >= 15 for k in kept), [len(k) for k in kept]  # both hold a share


def test_shards_are_labelled_and_write_what_the_example_writes(
        shards: list[MonitoringHost]) -> None:
    example = yaml.safe_load(EXAMPLE.read_text())
    for i, host in enumerate(shards):
        config = yaml.safe_load(host.prom_config.read_text())
        assert config["global"]["external_labels"] == {
            "cluster": "testcluster", "prometheus_shard": f"testcluster-{i}"}
        (scrape,) = config["scrape_configs"]
        (shipped,) = example["scrape_configs"]
        for key in ("sample_limit", "label_limit", "label_value_length_limit"):
            assert scrape[key] == shipped[key], key
        relabel = [dict(r) for r in shipped["relabel_configs"]]
        relabel[1]["regex"] = str(i)
        assert scrape["relabel_configs"] == relabel
        (remote,) = config["remote_write"]
        assert remote["url"] == STORE
        assert remote["write_relabel_configs"] == example["remote_write"][0][
            "write_relabel_configs"]


def test_one_shard_keeps_every_node_and_writes_nowhere(tmp_path: Path) -> None:
    host = MonitoringHost(tmp_path, gpu_nodes=NODES)
    rc, out, _ = host.play("--tags", "prometheus")
    assert rc == 0, out[-4000:]
    config = yaml.safe_load(host.prom_config.read_text())
    assert "remote_write" not in config and "relabel_configs" not in config["scrape_configs"][0]
    assert config["global"]["external_labels"] == {"cluster": "testcluster"}
    assert len(_kept(host.prom_config)) == len(NODES)


def test_a_shard_number_out_of_range_is_refused(tmp_path: Path) -> None:
    _, rc, out = _shard(tmp_path, 2)
    assert rc != 0 and "must be 0 to" in out, out[-3000:]
