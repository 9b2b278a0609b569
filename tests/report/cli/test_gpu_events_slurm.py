"""What slowed a job's GPU and what hit it, through the whole chain: two real Slurm jobs
at once on the test cluster, the real agent over the fake NVML, a real Prometheus, then
``slurm-gpu-report job``, the end-of-job mail (slurm-gpu-mail as the cluster's
MailProg) and the job dashboard's queries.

Job 1 holds GPU 0, which the fake power-caps SHARE of the time (its violation counter
runs SHARE of each second) from before the job starts until after it ends; an Xid 79
hits GPU 0 mid-job. Job 2 holds GPU 1 at the same time, never throttled (its power and
thermal counters exist and stay still) and never hit. The truths are what the test made
happen: SHARE of the time Slurm says job 1 ran, and the minute the Xid was injected.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_exporter.report.figures.gpu_events import clock
from tests.fakenvml import Device, Pattern, Process, XidEvent
from tests.mail.test_mail_slurm import RECORDER
from tests.support import wait_until
from tests.support.agent import Agent, series
from tests.support.daemons import DEPLOY, Prometheus
from tests.support.rig import Rig
from tests.support.slurmcluster import SlurmCluster
from tests.system.observe import grafana

pytestmark = [pytest.mark.process, pytest.mark.slurm, pytest.mark.fakenvml,
              pytest.mark.prometheus]

BIN = Path(sys.executable).parent
USER = "sgeuser"
SHARE = 0.4  # GPU 0's power-capped share of the time
SAMPLE_S = 1.0  # the agent's --sample-interval
RUN_S = 40  # each job's sleep
XID = 79
THROTTLED = "slurm_job_gpu_throttled_seconds_total"
ALLOCATED = "slurm_job_gpu_allocated_seconds_total"


@dataclass
class Chain:
    cluster: SlurmCluster
    prom: Prometheus
    capped: int  # job 1, on GPU 0
    plain: int  # job 2, on GPU 1
    busy_from: float  # wall time the fake was told both jobs' processes run at 100 %
    xid_at: float  # wall time just before the Xid was written into the fake's state
    accounted: dict[str, dict[str, str]]  # sacct's rows of both jobs
    inbox: Path
    mail_log: Path

    def report(self, *args: str) -> subprocess.CompletedProcess[str]:
        run = subprocess.run([str(BIN / "slurm-gpu-report"), *args, "--prometheus-url",
                              self.prom.url], capture_output=True, text=True, timeout=90,
                             env={**os.environ, **self.cluster.env}, check=False)
        assert run.returncode == 0, run.stderr
        return run

    def job_json(self, jobid: int) -> dict[str, Any]:
        (job,) = json.loads(self.report("job", str(jobid), "--format", "json").stdout)["jobs"]
        return job

    def held_s(self, jobid: int) -> float:
        """How long Slurm says the job ran (whole seconds)."""
        row = self.accounted[str(jobid)]
        return _slurm_time(row["End"]) - _slurm_time(row["Start"])


def _slurm_time(value: str) -> float:
    """A time as sacct prints it (local time, whole seconds)."""
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S").timestamp()


def _agent_value(agent: Agent, name: str, **labels: str) -> float | None:
    found = [v for lab, v in series(agent.metrics(), name)
             if all(lab.get(k) == want for k, want in labels.items())]
    return found[0] if found else None


def _prom_value(prom: Prometheus, expr: str) -> float | None:
    found = prom.vector(expr)
    return float(found[0]["value"][1]) if found else None


def _submit(cluster: SlurmCluster, name: str, mail: bool) -> int:
    extra = [f"--job-name={name}", *(["--mail-type=END", f"--mail-user={USER}"] if mail
                                     else [])]
    jobid = cluster.submit(f"sleep {RUN_S}\n", user=USER, gres="gpu:1", extra_args=extra)
    cluster.wait_state(jobid, "RUNNING", timeout=30)
    return jobid


def _mail_hook(cluster: SlurmCluster, work: Path, prom: Prometheus) -> tuple[Path, Path]:
    """slurm-gpu-mail as slurmctld's MailProg, its mailer a recorder; (inbox, its log)."""
    inbox = work / "inbox"
    inbox.mkdir()
    recorder = work / "record-mail"
    recorder.write_text(RECORDER.format(out=str(inbox)))
    recorder.chmod(0o755)
    log_file = work / "slurm-gpu-mail.log"
    config = work / "mail.toml"
    config.write_text(f'mailer = "{recorder}"\nprometheus_url = "{prom.url}"\n'
                      f'log_file = "{log_file}"\n')
    cluster.mail_hook.write_text(
        f"#!/bin/sh\nexport SLURM_GPU_MAIL_CONFIG={config} "
        f"SLURM_CONF={cluster.slurm_conf} PATH={cluster.node_path}\n"
        f'exec {cluster.site_bin / "slurm-gpu-mail"} "$@"\n')
    cluster.mail_hook.chmod(0o755)
    return inbox, log_file


@pytest.fixture(scope="module")
def chain(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Chain]:
    work = tmp_path_factory.mktemp("gpu-events-slurm")
    # Every GPU reports power and thermal counters; only GPU 0's power one ever runs.
    devices = [Device(index=i, throttle={"power": 0.0, "thermal": 0.0}) for i in range(4)]
    devices[0].throttle = {"power": SHARE, "thermal": 0.0}
    rig = Rig(work, cluster=slurm_cluster, devices=devices, sample_interval=SAMPLE_S)
    agent, prom = rig.agent, rig.prom
    jobs: list[int] = []
    try:
        inbox, mail_log = _mail_hook(slurm_cluster, work, prom)
        slurm_cluster.wait_no_jobs()  # an empty node: the first job gets GPU 0
        for name, mail in (("gpu-capped", True), ("gpu-plain", False)):
            jobs.append(_submit(slurm_cluster, name, mail))
        capped, plain = jobs
        for jobid, gpu in ((capped, 0), (plain, 1)):
            gpus = wait_until(lambda j=jobid: slurm_cluster.spool_gpus(j), 15,
                              f"job {jobid}'s GPUs")
            assert gpus == [gpu], f"job {jobid} got GPUs {gpus}, not [{gpu}]"
            pid = wait_until(lambda j=jobid: slurm_cluster.command_pid(j, "sleep"), 15,
                             f"job {jobid}'s sleep")
            rig.devices[gpu].processes = [Process(pid, 2 << 30, sm=Pattern.constant(100))]
        rig.write_nvml()
        busy_from = time.time()
        # Mid-job: both jobs counted for a while (not waiting on what the tests check).
        prom.wait_for(f'{ALLOCATED}{{jobid=~"{capped}|{plain}"}} > 5', timeout=30,
                      min_results=2)
        # Injected well inside a minute, so that the minute the agent stamps it with (a
        # moment later) is the one written here.
        wait_until(lambda: time.gmtime().tm_sec <= 50, 15, "a time well inside a minute")
        xid_at = time.time()
        rig.devices[0].xid_events = [XidEvent(seq=1, xid=XID)]
        rig.write_nvml()
        for jobid in jobs:
            slurm_cluster.wait_finished(jobid, timeout=RUN_S + 60)
        accounted = slurm_cluster.wait_accounted(jobs)
        # The agent's last counts of the ended jobs, scraped by Prometheus.
        for jobid in jobs:
            wait_until(lambda j=jobid: _agent_value(agent, "slurm_job_end_time_seconds",
                                                    jobid=str(j)), 15, f"job {jobid}'s end")
            final = _agent_value(agent, ALLOCATED, jobid=str(jobid))
            wait_until(lambda j=jobid, f=final: _prom_value(
                prom, f'{ALLOCATED}{{jobid="{j}"}}') == f, 15, f"job {jobid}'s last count")
        yield Chain(slurm_cluster, prom, capped, plain, busy_from, xid_at, accounted, inbox,
                    mail_log)
    finally:
        slurm_cluster.mail_hook.unlink(missing_ok=True)
        for jobid in jobs:
            slurm_cluster.cancel(jobid)
        rig.stop()


def test_the_job_report_gives_the_power_capped_share_and_the_xid_of_the_capped_job(
        chain: Chain) -> None:
    job = chain.job_json(chain.capped)
    (gpu,) = job["gpus_detail"]
    assert gpu["gpu"] == "0"
    power = gpu["throttled"]["power"]
    held = chain.held_s(chain.capped)
    allocated = gpu["allocated_hours"] * 3600
    truth = SHARE * held
    print(f"\njob {chain.capped}: power-capped {power['seconds']:.2f} s, truth "
          f"{truth:.2f} s ({SHARE:.0%} of {held:.0f} s per sacct; agent held {allocated:.1f} s);"
          f" share of held {power['held_ratio']:.4f}, of busy {power['busy_ratio']:.4f}")
    # Within one sample period of the job's time: the agent sees the start and the end
    # at its next sample, and sacct's times are whole seconds.
    assert power["seconds"] == pytest.approx(truth, abs=SAMPLE_S)
    assert power["seconds"] == pytest.approx(SHARE * allocated, abs=SAMPLE_S)
    assert power["held_ratio"] == pytest.approx(SHARE, abs=SAMPLE_S / held)
    assert gpu["throttled"]["thermal"]["seconds"] == 0.0  # reported, never active
    assert job["gpu_throttled"][0].startswith("GPU 0: power-capped ")
    assert len(job["gpu_throttled"]) == 1, job["gpu_throttled"]
    (xid,) = gpu["errors"]
    assert (xid["kind"], xid["detail"], xid["count"]) == ("xid", str(XID), 1.0)
    print(f"Xid injected at {chain.xid_at:.1f}, the agent saw it at {xid['last']}")
    assert xid["last"] is not None and chain.xid_at <= xid["last"] <= chain.xid_at + 5
    line = f"Xid {XID} at {clock(chain.xid_at)} on GPU 0"
    assert job["gpu_errors"] == [line]
    assert any(line in note for note in job["notes"]), job["notes"]  # gpu-errors

    text = chain.report("job", str(chain.capped)).stdout
    flat = " ".join(text.split())
    assert re.search(r"GPU 0 throttled.*power-capped \d+% of its busy time", flat), text
    assert line in flat, text


def test_the_job_beside_it_has_no_throttle_and_no_xid(chain: Chain) -> None:
    job = chain.job_json(chain.plain)
    (gpu,) = job["gpus_detail"]
    assert gpu["gpu"] == "1"
    # Its counters were read all along (both reasons reported) and stayed at 0.
    assert {r: t["seconds"] for r, t in gpu["throttled"].items()} == {
        "power": 0.0, "thermal": 0.0}
    assert gpu["errors"] == [] and job["gpu_throttled"] == [] and job["gpu_errors"] == []
    assert not any("Xid" in note or "power-capped" in note for note in job["notes"])
    text = chain.report("job", str(chain.plain)).stdout
    assert "throttled" not in text and "power-capped" not in text and "Xid" not in text, text


def test_the_end_mail_of_the_capped_job_carries_the_lines(chain: Chain) -> None:
    def mail() -> dict[str, Any] | None:
        for path in sorted(chain.inbox.glob("*.json")):
            found = json.loads(path.read_text())
            if found["env"].get("SLURM_JOB_ID") == str(chain.capped):
                return found
        return None

    body = wait_until(mail, 60, f"job {chain.capped}'s mail",
                      log=lambda: chain.mail_log.read_text() if chain.mail_log.exists()
                      else "")["body"]
    lines = [" ".join(line.split()) for line in body.splitlines()]
    assert any(re.fullmatch(r"GPU throttled: GPU 0: power-capped \d+% of its busy time "
                            r"\(\d+% of the time held\)", line) for line in lines), body
    assert f"GPU error: Xid {XID} at {clock(chain.xid_at)} on GPU 0" in lines, body


def test_the_job_dashboards_throttle_and_xid_panels_show_the_capped_job(
        chain: Chain) -> None:
    board = grafana.load(DEPLOY / "grafana" / "dashboards" / "slurm-gpu-job.json")
    panels = {t.panel: t for t in grafana.targets(board)
              if t.ref == "A" and ("throttled" in t.expr or "xid" in t.expr)}
    assert len(panels) == 2, list(panels)
    [throttle] = [t for t in panels.values() if THROTTLED in t.expr]
    [xid_last] = [t for t in panels.values() if "xid_last_timestamp" in t.expr]
    start = min(_slurm_time(row["Start"]) for row in chain.accounted.values()) - 60
    end = time.time()

    def shown(target: grafana.Target, jobid: int, label: str) -> dict[str, float]:
        result = grafana.run(chain.prom, target, {"cluster": ".*", "jobid": str(jobid)},
                             start, end)
        return {f'{s["metric"]["gpu"]}:{s["metric"][label]}': float(s["value"][1])
                for s in result}

    capped = shown(throttle, chain.capped, "reason")
    assert capped.keys() == {"0:power", "0:thermal"}, capped
    # The share of its busy time: GPU 0 was busy from busy_from to the job's end (sacct's
    # whole seconds: a few points of slack on 40 s).
    end_s = _slurm_time(chain.accounted[str(chain.capped)]["End"])
    truth = SHARE * chain.held_s(chain.capped) / (end_s - chain.busy_from)
    print(f"\nthe throttle panel: power {capped['0:power']:.4f} of busy time, truth {truth:.4f}")
    assert capped["0:power"] == pytest.approx(truth, abs=0.04) and capped["0:thermal"] == 0
    assert shown(throttle, chain.plain, "reason") == {"1:power": 0.0, "1:thermal": 0.0}
    (at,) = shown(xid_last, chain.capped, "xid").items()
    assert at[0] == f"0:{XID}" and chain.xid_at * 1000 <= at[1] <= (chain.xid_at + 5) * 1000
    assert shown(xid_last, chain.plain, "xid") == {}
