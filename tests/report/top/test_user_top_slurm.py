"""A user's ``slurm-gpu-report top`` in a real terminal, on the real cluster: sgeuser
follows their own running job (2 GPUs, one of them busy at a share the test sets in the
fake NVML) in tmux, through slurm-gpu-proxy --munge and a real Prometheus; the screen
shows that share, updates, and ends with the job's summary when the job ends. sgeuser2's
job is refused as ``job`` refuses it."""

from __future__ import annotations

import re
import shlex
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from tests.support import require, wait_until
from tests.support.daemons import Daemon
from tests.support.slurmcluster import SlurmCluster
from tests.support.user_jobs import (
    OTHER,
    OWNER,
    make_busy,
    monitor,
    report_argv,
    report_as_user,
    start_proxy,
    write_client_config,
)

pytestmark = [pytest.mark.process, pytest.mark.slurm, pytest.mark.every_release,
              pytest.mark.fakenvml,
              pytest.mark.prometheus]

JOB_S = 50  # OWNER's job: long enough for frames while busy, short for the suite
BUSY_PCT = 60  # the busy GPU's utilization in the fake NVML: the share top must show
TEMP_C = 67  # the busy GPU's temperature (a device series, public through the proxy)
SESSION = "top"
PCT = re.compile(r"^(\d+)%$")
CLOCK = re.compile(r"^at (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC", re.M)


@dataclass
class Setup:
    cluster: SlurmCluster
    proxy: Daemon
    client_config: Path
    jobs: dict[str, int]  # user -> job id
    gpus: list[int]  # OWNER's GPUs; the first is the busy one
    busy_since: float  # when the test made it busy (Unix time)


@pytest.fixture(scope="module")
def setup(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Setup]:
    work = tmp_path_factory.mktemp("user-top")
    public = Path(tempfile.mkdtemp(prefix="sge-client-", dir="/tmp"))  # users read it
    public.chmod(0o755)
    started: list = []
    jobs: dict[str, int] = {}
    try:
        rig = monitor(slurm_cluster, work)
        started.append(rig)
        # the GPUs' sizes, the targets' Slurm nodes and the temperature carry no user
        # label: public, so the user's frame shows them as root's does
        proxy = start_proxy(rig.prom.url, work, "--public-metric",
                            "slurm_gpu_memory_total_bytes", "slurm_gpu_exporter_node_info",
                            "slurm_gpu_temperature_celsius")
        started.append(proxy)
        proxy.wait_ready()
        client = write_client_config(public, proxy.url)
        jobs = {OWNER: slurm_cluster.submit(f"sleep {JOB_S}\n", user=OWNER, gres="gpu:2"),
                OTHER: slurm_cluster.submit("sleep 5\n", user=OTHER, gres="gpu:1")}
        for jobid in jobs.values():
            slurm_cluster.wait_state(jobid, "RUNNING", timeout=60)
        gpus = wait_until(lambda: slurm_cluster.spool_gpus(jobs[OWNER]), 15, "the GPUs")
        rig.devices[gpus[0]].temperature_c = TEMP_C
        make_busy(rig, slurm_cluster, jobs[OWNER], BUSY_PCT)
        busy_since = time.time()
        # top starts on a job Prometheus has (else: unknown job, exit 5)
        rig.prom.wait_for(f'count(slurm_job_gpu_allocated_seconds_total'
                                f'{{jobid="{jobs[OWNER]}"}}) == 2', timeout=30)
        yield Setup(slurm_cluster, proxy, client, jobs, gpus, busy_since)
    finally:
        for jobid in jobs.values():
            slurm_cluster.cancel(jobid)
        for thing in reversed(started):
            thing.stop()
        shutil.rmtree(public, ignore_errors=True)


class Tmux:
    """One tmux server of the test's own (its own socket), one session in it."""

    def __init__(self, where: Path) -> None:
        self.socket = where / "tmux.sock"
        conf = where / "tmux.conf"
        # read before the session's command runs: its last screen stays once it exits
        conf.write_text("set-option -g remain-on-exit on\n")
        self.conf = conf
        # The exit status as the shell saw it: tmux 3.3 can mark a pane dead (its output
        # closed) without ever recording its status.
        self.status_file = where / "exit-status"

    def __call__(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", str(self.socket), "-f", str(self.conf), *args],
                              capture_output=True, text=True, timeout=30,
                              check=True).stdout

    def start(self, argv: list[str]) -> None:
        command = f"{shlex.join(argv)}; echo $? > {shlex.quote(str(self.status_file))}"
        self("new-session", "-d", "-s", SESSION, "-x", "120", "-y", "40", command)

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", SESSION)

    def dead(self) -> tuple[bool, str]:
        """Whether the command exited, and its exit status."""
        try:
            status = self.status_file.read_text().strip()
        except FileNotFoundError:
            return False, ""
        return bool(status), status  # made but not yet written: not yet

    def stop(self) -> None:
        # this server alone: it listens on the test's socket
        subprocess.run(["tmux", "-S", str(self.socket), "kill-server"], capture_output=True,
                       timeout=30, check=False)


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    require(shutil.which("tmux") is not None, "tmux is not installed")
    where = Path(tempfile.mkdtemp(prefix="sge-tmux-", dir="/tmp"))  # a short socket path
    term = Tmux(where)
    try:
        yield term
    finally:
        term.stop()
        shutil.rmtree(where, ignore_errors=True)


def _row(screen: str, node: str, gpu: int) -> list[str] | None:
    """The frame's row of ``gpu``: Node GPU Busy-now Busy-job ..., split."""
    for line in screen.splitlines():
        cells = line.split()
        if cells[:2] == [node, str(gpu)]:
            return cells
    return None


def _pct(cell: str) -> int | None:
    match = PCT.match(cell)
    return int(match.group(1)) if match else None


def _sacct_time(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


@pytest.mark.host_release  # the terminal; munge and Slurm's answers are tested on every release
def test_owner_follows_their_running_job_in_a_terminal_to_its_summary(
        setup: Setup, tmux: Tmux) -> None:
    jobid, node = setup.jobs[OWNER], setup.cluster.node_name
    busy, idle = setup.gpus
    tmux.start(report_argv(setup.cluster, OWNER, setup.client_config, "top", str(jobid),
                           "--interval", "2"))

    def settled() -> str | None:
        # irate needs two samples after the switch; then every frame shows the share
        screen = tmux.screen()
        row = _row(screen, node, busy)
        fresh = time.time() - setup.busy_since > 5
        return screen if fresh and row and _pct(row[2]) is not None else None

    def log() -> str:
        return tmux.screen()

    first = wait_until(settled, 40, "a frame of the busy job", poll=0.5, log=log)
    assert f"Job {jobid}" in first and f"user {OWNER}" in first, first
    # 5 frames, 2 s apart: "now" is the change between the job's last two samples,
    # which a loaded agent can take a little late or early: their median is the share
    frames = [first]
    for _ in range(4):
        time.sleep(2)
        frames.append(tmux.screen())
    shares = []
    for screen in frames:
        row, other = _row(screen, node, busy), _row(screen, node, idle)
        assert row is not None and other is not None, screen
        shares.append(_pct(row[2]) or -99)
        assert _pct(other[2]) == 0 and _pct(other[3]) == 0, screen  # the idle GPU
        assert f"{TEMP_C} C" in " ".join(row), screen  # the public device series
        assert "2.0 GiB" in " ".join(row), screen  # the process's memory
    # Busy now: the share the fake NVML was told, on the busy GPU alone. "Now" is one
    # agent sample's busy seconds (whole driver samples, one every 167 ms on the fake)
    # over its allocated seconds (the wall time between two 1 s samples): a frame may
    # count one driver sample more or fewer than its second holds, BUSY_PCT * 0.167 off.
    bound = BUSY_PCT * 0.167 / 1.0 + 1  # + 1: top rounds to whole percent
    assert abs(statistics.median(shares) - BUSY_PCT) <= bound, (shares, frames[-1])
    # the frame is redrawn: 4 intervals later its clock has moved on
    clocks = [CLOCK.search(screen) for screen in (first, frames[-1])]
    assert clocks[0] and clocks[1], (first, frames[-1])
    moved = (datetime.fromisoformat(clocks[1].group(1))
             - datetime.fromisoformat(clocks[0].group(1))).total_seconds()
    assert moved >= 4, (first, frames[-1])

    def ended() -> tuple[bool, str] | None:
        dead, status = tmux.dead()
        return (dead, status) if dead else None

    _, status = wait_until(ended, JOB_S + 90, "top to exit after the job's end", poll=1,
                           log=log)
    last = tmux.screen()
    assert status == "0", last
    assert re.search(rf"Job {jobid} ended at \d{{4}}-", last), last
    # the summary: the whole job's busy share over both GPUs, against the test's truth
    facts = setup.cluster.sacct([jobid])[str(jobid)]
    start, end = _sacct_time(facts["Start"]), _sacct_time(facts["End"])
    truth = BUSY_PCT * (end - setup.busy_since) / (2 * (end - start))
    shown = re.search(r"GPU busy\s+(\d+(?:\.\d+)?)% over", last)
    assert shown, last
    assert abs(float(shown.group(1)) - truth) <= 5, (truth, last)
    assert "Busy now" not in last, last  # the summary replaced the live frame


def test_another_users_job_is_refused_as_job_refuses_it(setup: Setup) -> None:
    theirs = str(setup.jobs[OTHER])
    run = report_as_user(setup.cluster, OWNER, setup.client_config, "top", theirs, "--once")
    assert run.returncode == 10, (run.returncode, run.stdout, run.stderr)
    assert f"job {theirs} is not yours ({OWNER})" in run.stderr, run.stderr
    assert run.stdout == ""


@pytest.mark.host_release  # our wait; Slurm's answers are read as enforce reads them
def test_top_started_right_after_sbatch_waits_for_the_first_sample_not_an_error(
        setup: Setup) -> None:
    """``sbatch`` then ``top --once`` at once: Prometheus has no sample of the job yet
    (or just one); ``top`` waits for it and prints the job's frame, never "no metrics"."""
    jobid = setup.cluster.submit("sleep 40\n", user=OWNER, gres="gpu:1")
    try:
        run = report_as_user(setup.cluster, OWNER, setup.client_config, "top", str(jobid),
                             "--once", "--interval", "1")
    finally:
        setup.cluster.cancel(jobid)
    assert run.returncode == 0, (run.returncode, run.stdout, run.stderr)
    assert "no metrics" not in run.stderr, run.stderr
    assert run.stdout.startswith(f"Job {jobid}") and f"user {OWNER}" in run.stdout, run.stdout
    # at most the one waiting line (none where the first sample was in before top asked)
    assert all("waiting for" in line for line in run.stderr.splitlines()), run.stderr
