"""``remediate --requeue-opt all`` on real Slurm, Prometheus and Alertmanager: an Xid on
the GPU of a training job (submitted as a normal user with ``--requeue``) drains the
node, the job gets SIGUSR1, writes its checkpoint and exits, is requeued after the
grace and runs again from its checkpoint; a job on another GPU of the node keeps
running untouched; a second post of the same firing signals no one. An interactive
allocation (salloc) on a faulty GPU is neither signalled nor requeued: Slurm cannot
requeue it, and the signal would end a user's session for nothing.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import bcrypt
import pytest
import yaml

from tests.fakenvml import XidEvent
from tests.report.remediate.test_remediate_slurm import (
    ACTED_ON,
    PASSWORD,
    REPORT,
    USER,
    alerting,
    auth_headers,
    drained,
    firing_payload,
    node_scrape,
    post,
    resume,
    with_slurm_env,
)
from tests.support import free_port, wait_until
from tests.support.daemons import Alertmanager, Daemon, Prometheus
from tests.support.rig import Rig
from tests.support.slurmcluster import SlurmCluster
from tests.system.observe.conftest import generate_alerts

pytestmark = [pytest.mark.process, pytest.mark.slurm, pytest.mark.every_release,
              pytest.mark.fakenvml,
              pytest.mark.prometheus]

GRACE_S = 5
# The training job: resumes from its checkpoint when there is one; on SIGUSR1 (the
# batch script and its children get it: --requeue-signal-to full) it writes one and
# exits, as a training loop would after its last step.
TRAINING = """#!/bin/bash
ckpt="$PWD/ckpt-$SLURM_JOB_ID"
if [ -f "$ckpt" ]; then echo "resumed from $(cat "$ckpt") run $SLURM_RESTART_COUNT"; exit 0; fi
trap 'echo step-42 > "$ckpt"; echo checkpointed; exit 0' USR1
echo "fresh start"
while true; do sleep 1; done
"""
BYSTANDER = """#!/bin/bash
trap 'echo "got USR1"' USR1
while true; do sleep 1; done
"""


@dataclass
class Requeue:
    cluster: SlurmCluster
    remediate: Daemon
    stack: Rig  # the agent over the fake NVML, Prometheus with the rules, Alertmanager

    @property
    def prometheus(self) -> Prometheus:
        return self.stack.prom

    @property
    def alertmanager(self) -> Alertmanager:
        assert self.stack.alertmanager is not None
        return self.stack.alertmanager


@pytest.fixture(scope="module")
def rig(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[Requeue]:
    base = tmp_path_factory.mktemp("requeue")
    web_config = base / "web-config.yml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    web_config.write_text(yaml.safe_dump({"basic_auth_users": {USER: hashed}}))
    password_file = base / "remediate-password"
    password_file.write_text(PASSWORD)
    alerts = base / "alerts.yml"
    generate_alerts(alerts, {"gpu_errors_window": "1m"})
    resume(slurm_cluster)
    started: list[Any] = []
    try:
        port = free_port()
        am_config, sink = alerting(f"http://127.0.0.1:{port}", password_file)
        started.append(sink)
        # The site's agent on the cluster's spool, without Slurm look-ups.
        stack = Rig(base, spool_dir=slurm_cluster.spool_dir,
                    command=slurm_cluster.site_command("slurm-gpu-exporter"),
                    rule_files=[alerts], alertmanager=am_config,
                    scrape=node_scrape(slurm_cluster.node_name))
        started.append(stack)
        prom = stack.prom
        remediate = Daemon("remediate", [
            *with_slurm_env(slurm_cluster), str(REPORT), "remediate",
            "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(web_config),
            "--node-label", "node", "--prometheus-url", prom.url,
            "--state-file", str(base / "remediate-state" / "remediate.json"),
            "--requeue-opt", "all", "--requeue-signal", "USR1",
            "--requeue-grace", str(GRACE_S), "--requeue-signal-to", "full"], port, base)
        started.append(remediate)
        remediate.wait_ready("/-/healthy")
        prom.wait_for('up{job="slurm-gpu-exporter"} == 1', timeout=30)
        yield Requeue(slurm_cluster, remediate, stack)
    finally:
        for thing in reversed(started):
            thing.stop()
        resume(slurm_cluster)


def gpu_of(prom: Prometheus, jobid: int) -> str:
    """The GPU the agent shows the job on (Slurm's pick, through the prolog)."""
    found = prom.wait_for(f'slurm_job_gpu_allocated_seconds_total{{jobid="{jobid}"}}',
                          timeout=60)
    (gpu,) = {s["metric"]["gpu"] for s in found}
    return str(gpu)


def admin_comment(cluster: SlurmCluster, jobid: int) -> str:
    line = cluster.run(["scontrol", "-o", "show", "job", str(jobid)])
    return line.split("AdminComment=", 1)[1].split(" DerivedExitCode=", 1)[0] \
        if "AdminComment=" in line else ""


def counted(rig: Requeue, action: str, reason: str = "") -> float:
    request = urllib.request.Request(f"{rig.remediate.url}/metrics", headers=auth_headers())
    with urllib.request.urlopen(request, timeout=10) as resp:
        text = resp.read().decode()
    prefix = f'slurm_gpu_remediate_jobs_total{{action="{action}"'
    if reason:
        prefix += f',reason="{reason}"'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(prefix))


def test_a_gpu_fault_requeues_the_job_on_that_gpu_which_resumes_from_its_checkpoint(
        rig: Requeue) -> None:
    cluster = rig.cluster
    training = cluster.submit(TRAINING, gres="gpu:1",
                              extra_args=["--requeue", "--open-mode=append"])
    bystander = cluster.submit(BYSTANDER, gres="gpu:1", extra_args=["--requeue"])
    try:
        cluster.wait_state(training, "RUNNING", timeout=60)
        cluster.wait_state(bystander, "RUNNING", timeout=60)
        cluster.wait_output(training, "fresh start", timeout=30)
        gpu, other = gpu_of(rig.prometheus, training), gpu_of(rig.prometheus, bystander)
        assert gpu != other, "both jobs on one GPU: nothing tested"
        began = time.monotonic()
        rig.stack.devices[int(gpu)].xid_events = [XidEvent(seq=1, xid=79)]
        rig.stack.write_nvml()
        wait_until(lambda: drained(cluster), 90, "remediate to drain the node", poll=0.5,
                   log=rig.remediate.log)
        drained_at = time.monotonic()
        cluster.wait_output(training, "checkpointed", timeout=30)
        wait_until(lambda: "requeued job" in rig.remediate.log(), GRACE_S + 60,
                   "the requeue after the grace", poll=0.5, log=rig.remediate.log)
        requeued_at = time.monotonic()
        assert cluster.state(training) in ("PENDING", "REQUEUED")
        comment = admin_comment(cluster, training)
        assert "SlurmGpuXidResetRequired" in comment and f"gpu {gpu}" in comment
        assert "sent SIGUSR1" in comment and "requeued at" in comment
        # The job on the other GPU: never signalled, still running, no comment.
        assert cluster.state(bystander) == "RUNNING"
        assert "got USR1" not in cluster.output(bystander)
        assert admin_comment(cluster, bystander) in ("", "(null)")
        assert counted(rig, "signalled") == 1 and counted(rig, "requeued") == 1

        # A second post of the same firing (Alertmanager's repeat) signals no one.
        status, body = post(rig, firing_payload(rig))  # type: ignore[arg-type]
        assert status == 200 and isinstance(body, dict)
        assert [r.split(" (", 1)[0] for r in body["results"]] == [ACTED_ON]
        assert counted(rig, "signalled") == 1

        # The admin resets the GPU and resumes the node; Slurm holds a requeued job
        # back ~120 s (22.05); StartTime=now lets it start at once.
        resume(cluster)
        cluster.run(["scontrol", "update", f"JobId={training}", "StartTime=now"])
        cluster.wait_state(training, ("COMPLETED",), timeout=90)
        out = cluster.output(training)
        assert "resumed from step-42 run 1" in out, out
        print(f"requeue on Slurm: Xid to drain {drained_at - began:.1f} s, drain to "
              f"requeue {requeued_at - drained_at:.1f} s (grace {GRACE_S} s), requeue to "
              f"done {time.monotonic() - requeued_at:.1f} s")
        assert cluster.state(bystander) == "RUNNING"
    finally:
        for jobid in (training, bystander):
            cluster.cancel(jobid)


def test_an_interactive_job_on_a_faulty_gpu_is_neither_signalled_nor_requeued(
        rig: Requeue) -> None:
    cluster = rig.cluster
    resume(cluster)
    skipped = counted(rig, "skipped", "not_batch")
    signalled = counted(rig, "signalled")
    session = cluster.allocate("sgeuser", "gpu:2")
    try:
        cluster.wait_state(session, "RUNNING", timeout=60)
        found = rig.prometheus.wait_for(
            f'slurm_job_gpu_allocated_seconds_total{{jobid="{session}"}}', timeout=60,
            min_results=2)
        # A GPU no earlier test faulted: its alert is a new firing.
        gpu = min(s["metric"]["gpu"] for s in found
                  if not rig.stack.devices[int(s["metric"]["gpu"])].xid_events)
        rig.stack.devices[int(gpu)].xid_events = [XidEvent(seq=2, xid=79)]
        rig.stack.write_nvml()
        wait_until(lambda: drained(cluster), 90, "remediate to drain the node", poll=0.5,
                   log=rig.remediate.log)
        wait_until(lambda: f"job {session}: not a batch job" in rig.remediate.log(), 30,
                   "remediate to say why it leaves the session", poll=0.5,
                   log=rig.remediate.log)
        time.sleep(GRACE_S + 2)  # past the grace a requeue would have come after
        assert cluster.state(session) == "RUNNING"
        assert counted(rig, "signalled") == signalled
        assert counted(rig, "skipped", "not_batch") == skipped + 1, rig.remediate.log()
        assert "requeued job" not in rig.remediate.log().split(f"job {session}: not a", 1)[1]
    finally:
        cluster.cancel(session)
        resume(cluster)
