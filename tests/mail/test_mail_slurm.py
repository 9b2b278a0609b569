"""slurm-gpu-mail as the real cluster's MailProg: a GPU job with --mail-type=END; when it
ends, slurmctld's mail reaches the mailer with the job's summary added (the busy share
the test made, from Slurm's start and end times); with Prometheus stopped, the next
job's mail arrives as Slurm wrote it, within a few seconds. The mailer is a stand-in
that records what it gets."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from tests.fakenvml import Pattern, Process
from tests.support import wait_until
from tests.support.rig import Rig
from tests.support.slurmcluster import SlurmCluster

pytestmark = [pytest.mark.process, pytest.mark.slurm, pytest.mark.every_release,
              pytest.mark.fakenvml,
              pytest.mark.prometheus]

BIN = Path(sys.executable).parent
USER = "sgeuser"
RECORDER = """#!/usr/bin/python3
import json, os, sys, time
out = {out!r}
body = sys.stdin.buffer.read().decode(errors="replace")
env = {{k: v for k, v in os.environ.items() if k.startswith("SLURM_")}}
name = f"{{out}}/{{time.time_ns()}}.json"
with open(name + ".tmp", "w") as f:
    json.dump({{"argv": sys.argv[1:], "body": body, "env": env, "at": time.time()}}, f)
os.rename(name + ".tmp", name)
"""


@dataclass
class Mails:
    cluster: SlurmCluster
    inbox: Path
    log_file: Path
    rig: Rig

    def of(self, jobid: int, timeout: float = 60) -> dict:
        def found() -> dict | None:
            for path in sorted(self.inbox.glob("*.json")):
                mail = json.loads(path.read_text())
                if mail["env"].get("SLURM_JOB_ID") == str(jobid):
                    return mail
            return None
        return wait_until(found, timeout, f"the mail of job {jobid}",
                          log=lambda: self.wrapper_log())

    def wrapper_log(self) -> str:
        return self.log_file.read_text() if self.log_file.exists() else ""


@pytest.fixture(scope="module")
def mails(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Mails]:
    work = tmp_path_factory.mktemp("mail-slurm")
    inbox = work / "inbox"
    inbox.mkdir()
    recorder = work / "record-mail"
    recorder.write_text(RECORDER.format(out=str(inbox)))
    recorder.chmod(0o755)
    rig = Rig(work, cluster=slurm_cluster,
              command=slurm_cluster.site_command("slurm-gpu-exporter"))
    try:
        log_file = work / "slurm-gpu-mail.log"
        config = work / "mail.toml"
        config.write_text(f'mailer = "{recorder}"\nprometheus_url = "{rig.prom.url}"\n'
                          f'log_file = "{log_file}"\n')
        # slurmctld runs MailProg with SLURM_* variables only: the hook names the config
        # and the test cluster's slurm.conf, as /etc would on a real controller.
        slurm_cluster.mail_hook.write_text(
            f"#!/bin/sh\nexport SLURM_GPU_MAIL_CONFIG={config} "
            f"SLURM_CONF={slurm_cluster.slurm_conf} PATH={slurm_cluster.node_path}\n"
            f'exec {slurm_cluster.site_bin / "slurm-gpu-mail"} "$@"\n')
        slurm_cluster.mail_hook.chmod(0o755)
        yield Mails(slurm_cluster, inbox, log_file, rig)
    finally:
        slurm_cluster.mail_hook.unlink(missing_ok=True)
        rig.stop()


@dataclass(frozen=True)
class JobRun:
    jobid: int
    busy_from: float | None  # wall time the fake NVML was told one GPU is busy


def _run_job(mails: Mails, seconds: int, busy: bool) -> JobRun:
    cluster = mails.cluster
    jobid = cluster.submit(f"sleep {seconds}\n", user=USER, gres="gpu:2",
                           extra_args=["--mail-type=END", f"--mail-user={USER}"])
    busy_from = None
    try:
        cluster.wait_state(jobid, "RUNNING", timeout=30)
        if busy:
            pid = wait_until(lambda: cluster.command_pid(jobid, "sleep"), 15, "the job's sleep")
            gpus = wait_until(lambda: cluster.spool_gpus(jobid), 15, "the job's GPUs")
            for device in mails.rig.devices:
                device.processes = []
            mails.rig.devices[gpus[0]].processes = [Process(pid, 2 << 30,
                                                            sm=Pattern.constant(100))]
            mails.rig.write_nvml()
            busy_from = time.time()
        cluster.wait_finished(jobid, timeout=seconds + 60)
    except BaseException:
        cluster.cancel(jobid)
        raise
    return JobRun(jobid, busy_from)


def _slurm_time(value: str) -> float:
    """A time as scontrol prints it (local time, whole seconds)."""
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S").timestamp()


# How far the summary's counters may sit inside Slurm's start and end: the agent counts
# a job from the sample that first sees its record (up to one 1 s sample after the
# prolog, more on a loaded machine) and the mail, written the moment the job ends, reads
# the last scrape (1 s) of the last sample (1 s). Slurm's times are whole seconds.
COUNTERS_LAG_S = 2.5
SLURM_ROUNDING_S = 1.0


def _true_busy_percent(mails: Mails, run: JobRun) -> tuple[float, float]:
    """The range the job's busy share must lie in, from what the test made happen: one of
    its two GPUs at 100 % from the moment the fake NVML was told so until Slurm ended the
    job, over the two GPUs' time from Slurm's start to its end, as counters that start
    and stop up to COUNTERS_LAG_S inside that window (and Slurm's whole seconds) see it."""
    (record,) = [r for r in mails.cluster.job_info(run.jobid)
                 if r.get("JobId") == str(run.jobid)]
    start, end = _slurm_time(record["StartTime"]), _slurm_time(record["EndTime"])
    busy_from = run.busy_from
    assert busy_from is not None and start <= busy_from + 1 <= end + 1, record
    shares = []
    steps = [i / 10 for i in range(int(COUNTERS_LAG_S * 10) + 1)]
    for rounding in (0.0, SLURM_ROUNDING_S):
        for late in steps:
            for early in steps:
                first, last = start + late, end + rounding - early
                busy = max(0.0, last - max(busy_from, first))
                shares.append(100 * busy / (2 * (last - first)))
    return min(shares), max(shares)


def _report(*args: str) -> dict:
    run = subprocess.run([str(BIN / "slurm-gpu-report"), *args, "--format", "json"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)["jobs"][0]


def _elapsed(log: str, jobid: int) -> float:
    match = re.search(rf"job {jobid}: .*\(([0-9.]+) s\)", log)
    assert match, log
    return float(match.group(1))


def test_end_mail_carries_the_jobs_summary_then_goes_unchanged_without_prometheus(
        mails: Mails) -> None:
    run = _run_job(mails, 14, busy=True)
    jobid = run.jobid
    mail = mails.of(jobid)
    subject = mail["argv"][1]
    assert mail["argv"][0] == "-s" and mail["argv"][2:] == [USER], mail["argv"]
    assert subject.startswith(f"Slurm Job_id={jobid} ") and "Ended" in subject, subject
    body = mail["body"]
    assert f"efficiency of job {jobid}" in body, (body, mails.wrapper_log())
    assert re.search(r"GPUs held: +2 ", body), body
    busy = int(re.search(r"GPU busy: +(\d+)%", body).group(1))
    # Against what the test did, not another answer of the report: one of the two GPUs
    # busy from the moment the fake NVML was told (about 12 s of the job's 14 s), as the
    # counters see a job this short (COUNTERS_LAG_S); the report rounds to whole percent.
    low, high = _true_busy_percent(mails, run)
    assert low - 1 <= busy <= high + 1, (busy, (low, high), body)
    assert high < 60, (low, high)  # a whole GPU's share (or both) would fall outside
    later = _report("job", str(jobid), "--prometheus-url", mails.rig.prom.url)
    for note in later["notes"]:
        # a run time in a note may differ by a second
        assert re.sub(r"\d", "0", note) in re.sub(r"\d", "0", body), (note, body)

    mails.rig.prom.stop()
    plain = _run_job(mails, 3, busy=False).jobid
    seen = time.time()
    unchanged = mails.of(plain, timeout=30)
    assert unchanged["body"] == "", unchanged["body"]  # Slurm's own (empty) body
    assert unchanged["argv"][0] == "-s" and unchanged["argv"][2:] == [USER]
    assert unchanged["argv"][1].startswith(f"Slurm Job_id={plain} ")
    # The wrapper logs once the mailer has taken the mail, so a moment after it arrives.
    said = f"job {plain}: mail sent as Slurm wrote it: the report failed"

    def logged() -> str | None:
        text = mails.wrapper_log()
        return text if said in text else None

    log = wait_until(logged, 10, "the wrapper's log line of the plain mail",
                     log=mails.wrapper_log)
    assert _elapsed(log, plain) < 5, log
    assert unchanged["at"] - seen < 10, (unchanged["at"], seen)
