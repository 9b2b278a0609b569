"""What the users' tests on the real cluster share: two users' GPU jobs run to their end
under an agent over the fake NVML, scraped by a real Prometheus; the real proxy with
munge; ``slurm-gpu-report`` run as a user (runuser) or as root."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.fakenvml import Pattern, Process
from tests.proxy.stack import write_configs
from tests.support import REPO, free_port, wait_until
from tests.support.daemons import Daemon, Prometheus
from tests.support.munge import SITE_SOCKET
from tests.support.rig import Rig
from tests.support.slurmcluster import SlurmCluster

BIN = Path(sys.executable).parent
SITE_PACKAGES = next((BIN.parent / "lib").glob("python3*/site-packages"))
OWNER, OTHER = "sgeuser", "sgeuser2"
# The user runs the same package with the system's Python (the test venv's interpreter
# lives under /root, which users cannot enter).
AS_USER = ("import sys; from slurm_gpu_exporter.report.cli.main import main; "
           "sys.argv[0] = 'slurm-gpu-report'; sys.exit(main())")


def report_argv(cluster: SlurmCluster, user: str, client: Path, *args: str) -> list[str]:
    """The command line of ``slurm-gpu-report ARGS`` as ``user`` (runuser, a bare
    environment), with the client config ``client``."""
    env = {"PATH": cluster.user_path, "LANG": "C.UTF-8", "HOME": "/tmp",
           "SLURM_CONF": str(cluster.slurm_conf), "PYTHONPATH": f"{REPO}:{SITE_PACKAGES}",
           "SLURM_GPU_REPORT_CLIENT": str(client)}
    return [shutil.which("runuser") or "/usr/sbin/runuser", "-u", user, "--", "env", "-i",
            *(f"{k}={v}" for k, v in env.items()), "/usr/bin/python3", "-c", AS_USER, *args]


def report_as_user(cluster: SlurmCluster, user: str, client: Path, *args: str
                   ) -> subprocess.CompletedProcess[str]:
    """``slurm-gpu-report ARGS`` as ``user``, with the client config ``client``."""
    return subprocess.run(report_argv(cluster, user, client, *args), capture_output=True,
                          text=True, timeout=120, check=False, cwd="/")


def make_busy(rig: Rig, cluster: SlurmCluster, jobid: int, percent: float) -> list[int]:
    """Make the job's first GPU ``percent`` busy from now on (its ``sleep`` process runs
    there with 2 GiB); returns the job's GPU indices."""
    pid = wait_until(lambda: cluster.command_pid(jobid, "sleep"), 15, "the sleep")
    gpus = wait_until(lambda: cluster.spool_gpus(jobid), 15, "the GPUs")
    rig.devices[gpus[0]].processes = [Process(pid, 2 << 30, sm=Pattern.constant(percent))]
    rig.write_nvml()
    return gpus


def monitor(cluster: SlurmCluster, work: Path) -> Rig:
    """The site's agent over the fake NVML's 4 GPUs, scraped every second by a
    Prometheus, ready."""
    return Rig(work, cluster=cluster, command=cluster.site_command("slurm-gpu-exporter"))


def run_gpu_jobs(cluster: SlurmCluster, work: Path, started: list, seconds: int
                 ) -> tuple[dict[str, int], Prometheus]:
    """OWNER's job on 2 GPUs (one 100 % busy) and OTHER's on 1, ``seconds`` long, run to
    their end and scraped to the last sample; the daemons started go on ``started``.
    Returns the job ids by user and the Prometheus."""
    # Submitted before the agent starts (as these tests always ran): the agent finds them
    # running, so their GPU time counts from its first sample, busy GPU or not.
    jobs = {user: cluster.submit(f"sleep {seconds}\n", user=user, gres=gres)
            for user, gres in ((OWNER, "gpu:2"), (OTHER, "gpu:1"))}
    rig = monitor(cluster, work)
    started.append(rig)
    for jobid in jobs.values():
        cluster.wait_state(jobid, "RUNNING", timeout=30)
    make_busy(rig, cluster, jobs[OWNER], 100)
    for jobid in jobs.values():
        cluster.wait_finished(jobid, timeout=60)
    ids = "|".join(map(str, jobs.values()))
    rig.prom.wait_for(f'count(last_over_time(slurm_job_end_time_seconds'
                      f'{{jobid=~"{ids}"}}[10m])) == 2', timeout=30)
    return jobs, rig.prom


def start_proxy(prometheus_url: str, work: Path, *extra: str) -> Daemon:
    """The real ``slurm-gpu-proxy --munge`` over ``prometheus_url``, root its admin."""
    web, proxy_config, _ = write_configs(work)
    port = free_port()
    proxy = Daemon("proxy", [
        str(BIN / "slurm-gpu-proxy"), "--prometheus-url", prometheus_url,
        "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(web),
        "--config", str(proxy_config), "--admin", "root", "--munge",
        f"--munge.socket={SITE_SOCKET}", *extra], port, work)
    return proxy


def write_client_config(public: Path, proxy_url: str) -> Path:
    """The site's client config, readable by the users."""
    client = public / "client.toml"
    client.write_text(f'prometheus_url = "{proxy_url}"\nauth = "munge"\n')
    client.chmod(0o644)
    return client
