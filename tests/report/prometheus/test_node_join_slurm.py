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
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fakenvml import Device, NvmlState, Process, XidEvent, fake_nvml_or_skip
from tests.support import free_port, wait_until
from tests.support.agent import Agent
from tests.support.daemons import Daemon, Prometheus
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
class Rig:
    cluster: SlurmCluster
    address: str  # the agent's, 127.0.0.1:PORT
    jobid: str
    job_gpu: int
    proms: dict[str, Prometheus]
    policy: Path
    fake: Any
    nvml: NvmlState


@pytest.fixture(scope="module")
def rig(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[Rig]:
    base = tmp_path_factory.mktemp("node-join")
    fake = fake_nvml_or_skip(base / "nvml")
    nvml = NvmlState(devices=[Device(index=i) for i in range(2)])
    fake.write(nvml)
    policy = base / "policy.toml"
    policy.write_text(POLICY)
    alerts = base / "alerts.yml"
    generate_alerts(alerts, {"gpu_errors_window": "1m"})
    started: list[Any] = []
    jobid = None
    try:
        agent = Agent(["--spool-dir", str(slurm_cluster.spool_dir), "--state-dir",
                       str(base / "state"), "--sample-interval", "1", "--slurm-lookup", "cli",
                       "--node-name", slurm_cluster.node_name],
                      env={**fake.env(), **slurm_cluster.env}, log_path=base / "agent.log")
        started.append(agent)
        address = f"127.0.0.1:{agent.port}"
        file_sd = base / "targets.json"
        file_sd.write_text(json.dumps([{"targets": [address],
                                        "labels": {"instance": FQDN_TARGET}}]))
        scrapes: dict[str, dict[str, Any]] = {
            "ip": {"static_configs": [{"targets": [address]}]},
            "fqdn": {"file_sd_configs": [{"files": [str(file_sd)]}]},
            "old": {"static_configs": [{"targets": [address], "labels": {
                        "instance": f"{slurm_cluster.node_name}:9817"}}],
                    "metric_relabel_configs": [{
                        "source_labels": ["__name__"], "action": "drop",
                        "regex": "slurm_gpu_exporter_node_info"}]},
        }
        renamed = {"file_sd_configs": [{"files": [str(file_sd)]}],
                   "metric_relabel_configs": [
                       {"source_labels": ["__name__"], "action": "keep",
                        "regex": "slurm_gpu_exporter_node_info"},
                       {"target_label": "slurm_node", "replacement": "gpu-renamed"}]}
        proms = {}
        for name, scrape in [*scrapes.items(), ("twice", scrapes["fqdn"])]:
            jobs = [{"job_name": "slurm-gpu-exporter", **scrape}]
            if name == "twice":
                jobs.append({"job_name": "slurm-gpu-exporter-renamed", **renamed})
            proms[name] = Prometheus(f"prometheus-{name}", {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(alerts)],
                "scrape_configs": [{"scrape_timeout": "1s", **job} for job in jobs]},
                base / f"prometheus-{name}")
            started.append(proms[name])
        agent.wait_ready()
        for prom in proms.values():
            prom.wait_ready()
        jobid = str(slurm_cluster.submit("sleep 600\n", gres="gpu:1",
                                         extra_args=["--job-name=idle-node-join"]))
        slurm_cluster.wait_state(int(jobid), "RUNNING", timeout=30)
        pid = min(slurm_cluster.wait_for_process(int(jobid), "batch"))
        record = wait_until(lambda: slurm_cluster.gpu_record(jobid), 15, "the spool record")
        job_gpu = int(record["job_gpus"])
        nvml.devices[job_gpu].processes = [Process(pid, 1 << 30)]  # held, never busy
        fake.write(nvml)
        for prom in proms.values():
            prom.wait_for(f'slurm_job_gpu_allocated_seconds_total{{jobid="{jobid}"}}',
                          timeout=30)
        yield Rig(slurm_cluster, address, jobid, job_gpu, proms, policy, fake, nvml)
    finally:
        if jobid is not None:
            slurm_cluster.cancel(jobid)
        for thing in reversed(started):
            thing.stop()


def _report(rig: Rig, prom: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPORT), *args, "--prometheus-url", rig.proms[prom].url,
                           "--timeout", "5"], capture_output=True, text=True, timeout=90,
                          env={**os.environ, **rig.cluster.env}, check=False)


def _due_for_cancel(rig: Rig, prom: str) -> tuple[subprocess.CompletedProcess[str],
                                                  dict[str, Any]]:
    """The first dry run that would cancel the idle job; the last run's decision in the
    failure when none does within a minute (a node that does not match stays doubtful)."""
    deadline = time.monotonic() + 60
    while True:
        run = _report(rig, prom, "enforce", "--policy", str(rig.policy), "--format", "json",
                      "--state-file", str(rig.policy.with_suffix(f".{prom}.json")))
        decisions = json.loads(run.stdout)["decisions"] if run.stdout.startswith("{") else []
        decision = next((d for d in decisions if d["jobid"] == rig.jobid), {})
        if decision.get("action") == "cancel":
            return run, decision
        assert time.monotonic() < deadline, (
            f"{prom}: the idle job never came due: rc {run.returncode}, {decision}\n"
            f"{run.stderr[-1500:]}")
        time.sleep(1)


def test_the_agent_names_its_slurm_node_and_the_cluster_of_the_real_slurm_conf(
        rig: Rig) -> None:
    [info] = rig.proms["ip"].vector("slurm_gpu_exporter_node_info")
    assert {k: info["metric"][k] for k in ("instance", "slurm_node", "slurm_cluster")} == {
        "instance": rig.address, "slurm_node": rig.cluster.node_name,
        "slurm_cluster": rig.cluster.cluster_name}


@pytest.mark.parametrize("prom", ["ip", "fqdn"])
def test_enforce_finds_the_slurm_node_of_a_target_named_by_address_or_fqdn(
        rig: Rig, prom: str) -> None:
    run, decision = _due_for_cancel(rig, prom)
    assert decision["nodes"] == [rig.cluster.node_name] and not decision["doubtful"]
    assert run.returncode == 0, run.stderr
    assert "name no one Slurm node" not in run.stderr


def test_enforce_takes_the_targets_host_where_the_agent_names_no_node_and_says_so(
        rig: Rig) -> None:
    run, decision = _due_for_cancel(rig, "old")
    assert decision["nodes"] == [rig.cluster.node_name]
    assert f"the agents at {rig.cluster.node_name}:9817 name no one Slurm node" in run.stderr


def test_a_target_that_names_two_nodes_is_not_joined_to_either(rig: Rig) -> None:
    """The join leaves such a target out (its host stands in, so the job is doubtful)
    rather than failing the whole query (many-to-many) or guessing a node."""
    rig.proms["twice"].wait_for('count by (instance) (slurm_gpu_exporter_node_info) == 2')
    run = _report(rig, "twice", "enforce", "--policy", str(rig.policy), "--format", "json",
                  "--state-file", str(rig.policy.with_suffix(".twice.json")))
    assert run.returncode == 7, run.stderr
    [decision] = [d for d in json.loads(run.stdout)["decisions"] if d["jobid"] == rig.jobid]
    assert decision["nodes"] == ["gpu-a.example.org"] and decision["doubtful"]
    assert f"the agents at {FQDN_TARGET} name no one Slurm node" in run.stderr


@pytest.mark.parametrize("prom", ["ip", "fqdn"])
def test_job_report_shows_the_slurm_node_not_the_target(rig: Rig, prom: str) -> None:
    run = _report(rig, prom, "job", rig.jobid, "--no-sacct", "--format", "json")
    assert run.returncode == 0, run.stderr
    [job] = json.loads(run.stdout)["jobs"]
    assert [g["node"] for g in job["gpus_detail"]] == [rig.cluster.node_name]


def _firing(prom: Prometheus) -> list[dict[str, str]]:
    return [s["metric"] for s in prom.vector(f'ALERTS{{alertname="{ALERT}",'
                                             'alertstate="firing"}')]


def test_remediate_drains_the_slurm_node_of_an_alert_on_an_address_or_fqdn_target(
        rig: Rig, tmp_path: Path) -> None:
    """The alert as Alertmanager posts it (the ALERTS series' labels), to a dry run:
    remediate names the node Slurm lists, which the old code took to be the target's
    host (127.0.0.1, gpu-a.example.org) and refused."""
    other = 1 - rig.job_gpu  # not the idle job's GPU
    rig.nvml.devices[other].xid_events = [XidEvent(seq=1, xid=79)]
    rig.fake.write(rig.nvml)
    results = {}
    for prom in ("ip", "fqdn"):
        [labels] = wait_until(lambda p=prom: _firing(rig.proms[p]), 60,
                              f"{ALERT} firing in {prom}")
        port = free_port()
        remediate = Daemon(f"remediate-{prom}", [
            "env", *(f"{k}={v}" for k, v in rig.cluster.env.items()), str(REPORT),
            "remediate", "--web.listen-address", f"127.0.0.1:{port}", "--dry-run",
            "--prometheus-url", rig.proms[prom].url], port, tmp_path)
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
    node = rig.cluster.node_name
    assert results == {"ip": (rig.address, [f"dry run: would drain {node}"]),
                       "fqdn": (FQDN_TARGET, [f"dry run: would drain {node}"])}
