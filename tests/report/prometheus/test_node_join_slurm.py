"""Which Slurm node a GPU is on, whatever Prometheus names its agent's target, with no
relabelling: a real Slurm job, the agent over the fake NVML (``--node-name`` the
cluster's node), and real Prometheus servers scraping that one agent as

- ``ip``: ``127.0.0.1:PORT``, as a file or DNS SD target by address is named;
- ``fqdn``: a file SD target whose ``instance`` is ``gpu-a.example.org:9817`` (an FQDN
  target, without the DNS that would need);
- ``old``: a target named after the node, where the agent's
  ``slurm_gpu_exporter_node_info`` is dropped (an agent from before it);
- ``twice``: the ``fqdn`` target, and a second scrape of it whose node info names
  another node (as after a rename): a target naming two nodes.

``enforce`` and ``remediate`` must find the node Slurm runs the job on (``ip`` and
``fqdn`` through the info series; ``old`` through the target's host, saying so), and
``job`` must show it; ``twice`` must not be guessed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fakenvml import Process, XidEvent
from tests.support import free_port, wait_until
from tests.support.daemons import Daemon, Prometheus
from tests.support.rig import Rig, Scrape
from tests.support.slurmcluster import SlurmCluster
from tests.system.observe.conftest import generate_alerts

pytestmark = [pytest.mark.process, pytest.mark.slurm, pytest.mark.fakenvml,
              pytest.mark.prometheus]

REPORT = Path(sys.executable).parent / "slurm-gpu-report"
FQDN_TARGET = "gpu-a.example.org:9817"
ALERT = "SlurmGpuXidResetRequired"
# As test_enforce_faults.py: a 20 s window whose counters can cover 80 % of it.
POLICY = """
[idle]
warn_after = []
cancel_after = "20s"
min_job_age = "4s"
"""


@dataclass
class Joined:
    cluster: SlurmCluster
    rig: Rig
    jobid: str
    job_gpu: int
    proms: dict[str, Prometheus]  # by the name the module's doc gives
    policy: Path

    @property
    def address(self) -> str:
        """The agent's, 127.0.0.1:PORT."""
        return self.rig.address


def _scrapes(cluster: SlurmCluster, base: Path) -> dict[str, Scrape]:
    """The scrape jobs of the four Prometheus servers (see above), each every 1 s."""
    file_sd = base / "targets.json"

    def by_file(address: str) -> dict[str, Any]:
        file_sd.write_text(json.dumps([{"targets": [address],
                                        "labels": {"instance": FQDN_TARGET}}]))
        return {"file_sd_configs": [{"files": [str(file_sd)]}]}

    def ip(address: str) -> list[dict[str, Any]]:
        return [{"static_configs": [{"targets": [address]}]}]

    def fqdn(address: str) -> list[dict[str, Any]]:
        return [by_file(address)]

    def old(address: str) -> list[dict[str, Any]]:
        return [{"static_configs": [{"targets": [address], "labels": {
                     "instance": f"{cluster.node_name}:9817"}}],
                 "metric_relabel_configs": [{
                     "source_labels": ["__name__"], "action": "drop",
                     "regex": "slurm_gpu_exporter_node_info"}]}]

    def twice(address: str) -> list[dict[str, Any]]:
        renamed = {"job_name": "slurm-gpu-exporter-renamed", **by_file(address),
                   "metric_relabel_configs": [
                       {"source_labels": ["__name__"], "action": "keep",
                        "regex": "slurm_gpu_exporter_node_info"},
                       {"target_label": "slurm_node", "replacement": "gpu-renamed"}]}
        return [by_file(address), renamed]

    def scrape(jobs: Callable[[str], list[dict[str, Any]]]) -> Scrape:
        return Scrape(configs=lambda address: [
            {"job_name": "slurm-gpu-exporter", "scrape_timeout": "1s", **job}
            for job in jobs(address)])

    return {f"prometheus-{name}": scrape(jobs)
            for name, jobs in (("ip", ip), ("fqdn", fqdn), ("old", old), ("twice", twice))}


@pytest.fixture(scope="module")
def joined(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Joined]:
    base = tmp_path_factory.mktemp("node-join")
    policy = base / "policy.toml"
    policy.write_text(POLICY)
    alerts = base / "alerts.yml"
    generate_alerts(alerts, {"gpu_errors_window": "1m"})
    jobid = None
    with Rig(base, cluster=slurm_cluster, devices=2, scrapes=_scrapes(slurm_cluster, base),
             rule_files=[alerts]) as rig:
        try:
            jobid = str(slurm_cluster.submit("sleep 600\n", gres="gpu:1",
                                             extra_args=["--job-name=idle-node-join"]))
            slurm_cluster.wait_state(int(jobid), "RUNNING", timeout=30)
            pid = min(slurm_cluster.wait_for_process(int(jobid), "batch"))
            record = wait_until(lambda: slurm_cluster.gpu_record(jobid), 15, "the spool record")
            job_gpu = int(record["job_gpus"])
            rig.devices[job_gpu].processes = [Process(pid, 1 << 30)]  # held, never busy
            rig.write_nvml()
            proms = {name.removeprefix("prometheus-"): prom for name, prom in rig.proms.items()}
            for prom in proms.values():
                prom.wait_for(f'slurm_job_gpu_allocated_seconds_total{{jobid="{jobid}"}}',
                              timeout=30)
            yield Joined(slurm_cluster, rig, jobid, job_gpu, proms, policy)
        finally:
            if jobid is not None:
                slurm_cluster.cancel(jobid)


def _report(joined: Joined, prom: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPORT), *args, "--prometheus-url", joined.proms[prom].url,
                           "--timeout", "5"], capture_output=True, text=True, timeout=90,
                          env={**os.environ, **joined.cluster.env}, check=False)


def _due_for_cancel(joined: Joined, prom: str
                    ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The first dry run that would cancel the idle job; the last run's decision in the
    failure when none does within a minute (a node that does not match stays doubtful)."""
    last = [""]

    def due() -> tuple[subprocess.CompletedProcess[str], dict[str, Any]] | None:
        run = _report(joined, prom, "enforce", "--policy", str(joined.policy), "--format",
                      "json", "--state-file", str(joined.policy.with_suffix(f".{prom}.json")))
        decisions = json.loads(run.stdout)["decisions"] if run.stdout.startswith("{") else []
        decision = next((d for d in decisions if d["jobid"] == joined.jobid), {})
        last[0] = f"last run: rc {run.returncode}, {decision}\n{run.stderr[-1500:]}"
        return (run, decision) if decision.get("action") == "cancel" else None

    return wait_until(due, 60, f"{prom}: the idle job to come due", poll=1,
                      log=lambda: last[0])


def test_the_agent_names_its_slurm_node_and_the_cluster_of_the_real_slurm_conf(
        joined: Joined) -> None:
    [info] = joined.proms["ip"].vector("slurm_gpu_exporter_node_info")
    assert {k: info["metric"][k] for k in ("instance", "slurm_node", "slurm_cluster")} == {
        "instance": joined.address, "slurm_node": joined.cluster.node_name,
        "slurm_cluster": joined.cluster.cluster_name}


@pytest.mark.parametrize("prom", ["ip", "fqdn"])
def test_enforce_finds_the_slurm_node_of_a_target_named_by_address_or_fqdn(
        joined: Joined, prom: str) -> None:
    run, decision = _due_for_cancel(joined, prom)
    assert decision["nodes"] == [joined.cluster.node_name] and not decision["doubtful"]
    assert run.returncode == 0, run.stderr
    assert "name no one Slurm node" not in run.stderr


def test_enforce_takes_the_targets_host_where_the_agent_names_no_node_and_says_so(
        joined: Joined) -> None:
    run, decision = _due_for_cancel(joined, "old")
    assert decision["nodes"] == [joined.cluster.node_name]
    node = joined.cluster.node_name
    assert f"the agents at {node}:9817 name no one Slurm node" in run.stderr


def test_a_target_that_names_two_nodes_is_not_joined_to_either(joined: Joined) -> None:
    """The join leaves such a target out (its host stands in, so the job is doubtful)
    rather than failing the whole query (many-to-many) or guessing a node."""
    joined.proms["twice"].wait_for('count by (instance) (slurm_gpu_exporter_node_info) == 2')
    run = _report(joined, "twice", "enforce", "--policy", str(joined.policy), "--format",
                  "json", "--state-file", str(joined.policy.with_suffix(".twice.json")))
    assert run.returncode == 7, run.stderr
    [decision] = [d for d in json.loads(run.stdout)["decisions"]
                  if d["jobid"] == joined.jobid]
    assert decision["nodes"] == ["gpu-a.example.org"] and decision["doubtful"]
    assert f"the agents at {FQDN_TARGET} name no one Slurm node" in run.stderr


@pytest.mark.parametrize("prom", ["ip", "fqdn"])
def test_job_report_shows_the_slurm_node_not_the_target(joined: Joined, prom: str) -> None:
    run = _report(joined, prom, "job", joined.jobid, "--no-sacct", "--format", "json")
    assert run.returncode == 0, run.stderr
    [job] = json.loads(run.stdout)["jobs"]
    assert [g["node"] for g in job["gpus_detail"]] == [joined.cluster.node_name]


def _firing(prom: Prometheus) -> list[dict[str, str]]:
    return [s["metric"] for s in prom.vector(f'ALERTS{{alertname="{ALERT}",'
                                             'alertstate="firing"}')]


def test_remediate_drains_the_slurm_node_of_an_alert_on_an_address_or_fqdn_target(
        joined: Joined, tmp_path: Path) -> None:
    """The alert as Alertmanager posts it (the ALERTS series' labels), to a dry run:
    remediate names the node Slurm lists, which the old code took to be the target's
    host (127.0.0.1, gpu-a.example.org) and refused."""
    other = 1 - joined.job_gpu  # not the idle job's GPU
    joined.rig.devices[other].xid_events = [XidEvent(seq=1, xid=79)]
    joined.rig.write_nvml()
    results = {}
    for prom in ("ip", "fqdn"):
        [labels] = wait_until(lambda p=prom: _firing(joined.proms[p]), 60,
                              f"{ALERT} firing in {prom}")
        port = free_port()
        remediate = Daemon(f"remediate-{prom}", [
            "env", *(f"{k}={v}" for k, v in joined.cluster.env.items()), str(REPORT),
            "remediate", "--web.listen-address", f"127.0.0.1:{port}", "--dry-run",
            "--prometheus-url", joined.proms[prom].url], port, tmp_path)
        try:
            remediate.wait_ready("/-/healthy")
            alert = {k: v for k, v in labels.items() if k not in ("__name__", "alertstate")}
            payload = {"alerts": [{"status": "firing", "fingerprint": prom,
                                   "startsAt": "2026-12-04T10:00:00Z", "labels": alert}]}
            request = urllib.request.Request(f"{remediate.url}/alerts", method="POST",
                                             data=json.dumps(payload).encode())
            with urllib.request.urlopen(request, timeout=30) as resp:
                results[prom] = (alert["instance"], json.load(resp)["results"])
        finally:
            remediate.stop()
    node = joined.cluster.node_name
    assert results == {"ip": (joined.address, [f"dry run: would drain {node}"]),
                       "fqdn": (FQDN_TARGET, [f"dry run: would drain {node}"])}
