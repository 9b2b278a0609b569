"""Two topologies over one simulated fleet, built from the shipped scale-out config.

``one``: a single Prometheus scraping every node (what sites run today). ``shards``: two
Prometheus servers from ``deploy/prometheus/scale-out/shard.yml``, each keeping its
``hashmod`` share of the nodes, evaluating the node-tier rules and remote-writing to a
real VictoriaMetrics (Debian's ``victoria-metrics``). Only addresses, paths and
intervals differ from the shipped file. Every daemon listens on 127.0.0.1, keeps its data
in the given directory and is ended by its own PID.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.support import free_port, wait_until
from tests.support.daemons import DEPLOY, Daemon, Prometheus, end_process, http_json, tool

SHARD_EXAMPLE = DEPLOY / "prometheus" / "scale-out" / "shard.yml"
RULES = DEPLOY / "prometheus" / "rules"
# VictoriaMetrics' defaults that differ from Prometheus' (scale-out/victoria-metrics.md):
# it hides samples younger than 30 s from queries, and caches answers.
VM_FLAGS = ("-search.latencyOffset=1s", "-search.disableCache")


class VictoriaMetrics(Daemon):
    """Debian's single-node VictoriaMetrics: remote-write receiver and Prometheus API."""

    def __init__(self, workdir: Path, extra: tuple[str, ...] = VM_FLAGS) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        binary = tool("victoria-metrics", package="victoria-metrics")
        super().__init__("victoria-metrics", [
            binary, f"-storageDataPath={workdir / 'data'}",
            f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=WARN", "-retentionPeriod=1y",
            *extra], port, workdir)

    def wait_ready(self, path: str = "/health", timeout: float = 30) -> None:
        super().wait_ready(path, timeout)

    def vector(self, expr: str, at: float | None = None) -> list[dict]:
        args = {"query": expr} | ({} if at is None else {"time": f"{at:.3f}"})
        answer = http_json(self.url + "/api/v1/query", args)
        assert answer["status"] == "success", (expr, answer)
        return answer["data"]["result"]


def shard_config(targets: Path | list[Path], shard: int | None, shards: int,
                 write_url: str | None, interval: str = "1s") -> dict:
    """The shipped shard config for ``shard`` of ``shards``; ``shard=None``: one Prometheus
    with every node (no relabelling, no shard label, no remote write)."""
    config = copy.deepcopy(yaml.safe_load(SHARD_EXAMPLE.read_text()))
    config["global"].update(scrape_interval=interval, evaluation_interval=interval)
    config["rule_files"] = [str(RULES / Path(p).name) for p in config["rule_files"]]
    del config["alerting"]
    (scrape,) = config["scrape_configs"]
    scrape["scrape_timeout"] = interval
    files = [str(t) for t in (targets if isinstance(targets, list) else [targets])]
    scrape["file_sd_configs"] = [{"files": files, "refresh_interval": "1s"}]
    labels = config["global"]["external_labels"]
    if shard is None:
        del scrape["relabel_configs"], config["remote_write"], labels["prometheus_shard"]
        return config
    scrape["relabel_configs"][0]["modulus"] = shards
    scrape["relabel_configs"][1]["regex"] = str(shard)
    labels["prometheus_shard"] = f"{labels['cluster']}-{shard}"
    (remote,) = config["remote_write"]
    if write_url is None:
        del config["remote_write"]
    else:
        remote["url"] = write_url
        remote["queue_config"] = {"batch_send_deadline": "1s"}
    return config


@dataclass
class FleetProcess:
    """The fleet simulator as a child process; its targets file appears once it listens."""

    targets: Path
    args: list[str]
    proc: subprocess.Popen = field(init=False)
    spawned: float = field(init=False)  # the fleet's clock starts after this...
    listening: float = field(init=False)  # ...and before this

    def __post_init__(self) -> None:
        self.spawned = time.time()
        self.log = self.targets.with_suffix(".log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "slurm_gpu_exporter.sim.fleet_server",
             "--targets-file", str(self.targets), *self.args],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(lambda: self.targets.exists() or self.proc.poll() is not None, 60,
                   "the fleet's targets file", poll=0.2)
        self.listening = time.time()
        assert self.proc.poll() is None, self.targets.with_suffix(".log").read_text()

    def stop(self) -> None:
        end_process(self.proc)
        self.log.close()


@dataclass
class Topologies:
    fleet: FleetProcess
    one: Prometheus
    shards: list[Prometheus]
    store: VictoriaMetrics
    ended: float = 0.0  # when the fleet's jobs ended, where they do


@contextmanager
def topologies(base: Path, fleet_args: list[str], shards: int = 2,
               interval: str = "1s") -> Iterator[Topologies]:
    """The fleet, one Prometheus, ``shards`` shards and VictoriaMetrics, all ready."""
    with ExitStack() as stack:
        fleet = FleetProcess(base / "targets.json", fleet_args)
        stack.callback(fleet.stop)
        store = VictoriaMetrics(base / "vm")
        stack.callback(store.stop)
        one = Prometheus("one", shard_config(fleet.targets, None, shards, None, interval),
                         base / "one")
        stack.callback(one.stop)
        members = []
        for i in range(shards):
            shard = Prometheus(f"shard{i}", shard_config(
                fleet.targets, i, shards, f"{store.url}/api/v1/write", interval), base / f"s{i}")
            stack.callback(shard.stop)
            members.append(shard)
        store.wait_ready()
        for daemon in (one, *members):
            daemon.wait_ready()
        yield Topologies(fleet, one, members, store)
