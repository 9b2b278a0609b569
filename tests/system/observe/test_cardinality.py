"""The shipped shard config's cardinality guards, on a real Prometheus (issue 35).

Three simulated nodes on one Prometheus built from ``scale-out/shard.yml``: an ordinary
node (8 GPUs, 8 jobs), a node whose jobs have names of 10,000 characters, and a node
running 1,000 jobs (24,000 series, past ``sample_limit``). The big node's scrape fails as
a whole (``up`` 0, nothing of it stored) and the others are untouched; the agent cuts the
long names to 256 characters, under ``label_value_length_limit``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from tests.support.daemons import Prometheus
from tests.system.observe.topology import SHARD_EXAMPLE, FleetProcess, shard_config

pytestmark = pytest.mark.process

FLEETS = {"plain": [], "long-names": ["--name-pad", "10000"],
          "thousand-jobs": ["--jobs-per-node", "1000"]}


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, dict]]:
    base = tmp_path_factory.mktemp("cardinality")
    started: list = []
    try:
        fleets = {}
        for name, args in FLEETS.items():
            fleets[name] = FleetProcess(base / f"{name}.json",
                                        ["--nodes", "1", "--sample-interval", "1", *args])
            started.append(fleets[name])
        prom = Prometheus("shard", shard_config([f.targets for f in fleets.values()], None, 1,
                                                None), base / "prom")
        started.append(prom)
        prom.wait_ready()
        prom.wait_for("up", timeout=30, min_results=len(FLEETS))
        prom.wait_for("scrape_samples_scraped > 0", timeout=30, min_results=len(FLEETS))
        addresses = {name: yaml.safe_load(f.targets.read_text())[0]["targets"][0]
                     for name, f in fleets.items()}
        yield prom, addresses
    finally:
        for thing in reversed(started):
            thing.stop()


def _one(prom: Prometheus, expr: str) -> float:
    (sample,) = prom.vector(expr)
    return float(sample["value"][1])


def test_a_node_past_the_sample_limit_fails_its_scrape_alone(
        prom: tuple[Prometheus, dict]) -> None:
    p, addr = prom
    limit = yaml.safe_load(SHARD_EXAMPLE.read_text())["scrape_configs"][0]["sample_limit"]
    assert _one(p, f'scrape_samples_scraped{{instance="{addr["thousand-jobs"]}"}}') > limit
    assert _one(p, f'up{{instance="{addr["thousand-jobs"]}"}}') == 0
    assert p.vector(f'slurm_job_info{{instance="{addr["thousand-jobs"]}"}}') == []
    for name in ("plain", "long-names"):
        assert _one(p, f'up{{instance="{addr[name]}"}}') == 1, name
        assert len(p.vector(f'slurm_job_info{{instance="{addr[name]}"}}')) == 8, name


def test_long_job_names_arrive_cut_to_the_agents_limit(prom: tuple[Prometheus, dict]) -> None:
    p, addr = prom
    names = {s["metric"]["name"] for s in
             p.vector(f'slurm_job_info{{instance="{addr["long-names"]}"}}')}
    assert names and all(len(n) == 256 for n in names), sorted(map(len, names))


def test_the_guards_are_in_the_shipped_config() -> None:
    (scrape,) = yaml.safe_load(SHARD_EXAMPLE.read_text())["scrape_configs"]
    assert (scrape["sample_limit"], scrape["label_limit"],
            scrape["label_value_length_limit"]) == (20000, 32, 1024)


def test_the_ordinary_nodes_series_fit_well_under_the_limit(
        prom: tuple[Prometheus, dict]) -> None:
    p, addr = prom
    assert _one(p, f'scrape_samples_scraped{{instance="{addr["plain"]}"}}') < 1000
