"""The job dashboard's training row: every query answered by a real Prometheus that
scrapes the real agent, to which a real process of a job publishes through the relay."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from slurm_gpu_exporter.sim.synthnode import SynthNode
from tests.support.daemons import DEPLOY, tool
from tests.support.rig import Rig, Scrape
from tests.system.observe import grafana
from tests.training_relay.conftest import Sender

pytestmark = pytest.mark.prometheus

JOB_DASHBOARD = DEPLOY / "grafana" / "dashboards" / "slurm-gpu-job.json"


def _node_tier() -> tuple[Scrape, str]:
    """The node tier's scrape job (with its cluster label), every second, pointed at the
    rig's agent; and that cluster label."""
    tier = yaml.safe_load((DEPLOY / "prometheus" / "federation" / "node-tier.yml").read_text())
    (scrape,) = tier["scrape_configs"]
    scrape.update(scrape_interval="1s", scrape_timeout="1s")

    def configs(address: str) -> list[dict]:
        scrape["static_configs"][0]["targets"] = [address]
        return [scrape]

    return Scrape(configs=configs), scrape["static_configs"][0]["labels"]["cluster"]


@pytest.fixture
def node() -> Iterator[SynthNode]:
    # A short base: the socket path must fit in 107 bytes.
    with tempfile.TemporaryDirectory(prefix="sge-dash-") as base:
        yield SynthNode(Path(base))


def test_every_training_panel_of_the_job_dashboard_shows_the_jobs_progress(
        node: SynthNode, tmp_path: Path) -> None:
    tool("prometheus", package="prometheus")
    board = grafana.load(JOB_DASHBOARD)
    training = [t for t in grafana.targets(board) if grafana.relayed(t.expr)]
    assert {t.panel for t in training} == {
        "Since the last step", "Loss", "Throughput", "Learning rate", "MLflow runs"}
    sender = Sender(str(node.spool_dir), "client", "0.75", "60")
    run = "0123456789abcdef0123456789abcdef"
    mlflow = Sender(str(node.spool_dir), "mlflow", run, "60")  # a script with a run
    node.add_job(4242, [sender.pid, mlflow.pid], user="alice")
    scrape, cluster = _node_tier()
    try:
        with Rig(tmp_path, devices=None, args=node.agent_args(0.5), scrapes={
                "training": scrape}) as rig:
            prometheus = rig.prom
            sender.go()
            mlflow.go()
            first = prometheus.wait_for('slurm_job_training_steps_total{jobid="4242"}')
            prometheus.wait_for(f'slurm_job_mlflow_run_info{{jobid="4242",run_id="{run}"}}')
            assert first[0]["metric"]["user"] == "alice"
            assert first[0]["metric"]["cluster"] == cluster
            # Rates over $__rate_interval (4 s) need a few scrapes.
            time.sleep(6)
            end = time.time()
            values = {"cluster": cluster, "jobid": "4242"}
            empty = [f"{t.where()}: {t.expr}" for t in training
                     if not grafana.run(prometheus, t, values, end - 30, end)]
            assert not empty, "\n".join(empty)
    finally:
        sender.kill()
        mlflow.kill()
