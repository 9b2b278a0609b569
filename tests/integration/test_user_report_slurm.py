"""A user's own report through slurm-gpu-proxy --munge, on the real cluster: sgeuser
runs ``slurm-gpu-report job`` as sgeuser (runuser, a munge credential per request from
the cluster's munged, the real proxy and Prometheus) and gets the figures root gets
from Prometheus directly; for sgeuser2's job, a clear refusal."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.agent import Agent
from tests.daemons import Daemon, Prometheus
from tests.fakenvml import Device, NvmlState, Pattern, Process, fake_nvml_or_skip
from tests.integration.slurmcluster import SlurmCluster
from tests.munge import SITE_SOCKET
from tests.proxy.stack import write_configs
from tests.support import free_port, wait_until

pytestmark = [pytest.mark.process, pytest.mark.slurm, pytest.mark.fakenvml,
              pytest.mark.prometheus]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SITE_PACKAGES = next((BIN.parent / "lib").glob("python3*/site-packages"))
OWNER, OTHER = "sgeuser", "sgeuser2"
# The user runs the same package with the system's Python (the test venv's interpreter
# lives under /root, which users cannot enter).
AS_USER = ("import sys; from slurm_gpu_exporter.report.cli.main import main; "
           "sys.argv[0] = 'slurm-gpu-report'; sys.exit(main())")


@dataclass
class Setup:
    cluster: SlurmCluster
    prometheus: Prometheus
    proxy: Daemon
    client_config: Path
    jobs: dict[str, int]  # user -> job id

    def as_user(self, user: str, *args: str, client: Path | None = None
                ) -> subprocess.CompletedProcess[str]:
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp",
               "SLURM_CONF": str(self.cluster.slurm_conf),
               "PYTHONPATH": f"{REPO}:{SITE_PACKAGES}",
               "SLURM_GPU_REPORT_CLIENT": str(client or self.client_config)}
        return subprocess.run(
            [shutil.which("runuser") or "/usr/sbin/runuser", "-u", user, "--", "env", "-i",
             *(f"{k}={v}" for k, v in env.items()), "/usr/bin/python3", "-c", AS_USER,
             *args], capture_output=True, text=True, timeout=120, check=False, cwd="/")


@pytest.fixture(scope="module")
def setup(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Setup]:
    work = tmp_path_factory.mktemp("user-report")
    # The users read their client configs here (pytest's directories are root's alone).
    public = Path(tempfile.mkdtemp(prefix="sge-client-", dir="/tmp"))
    public.chmod(0o755)
    fake = fake_nvml_or_skip(work / "nvml")
    devices = [Device(index=i, minor=i) for i in range(4)]
    fake.write(NvmlState(devices=devices))
    jobs = {user: slurm_cluster.submit("sleep 15\n", user=user, gres=gres)
            for user, gres in ((OWNER, "gpu:2"), (OTHER, "gpu:1"))}
    started: list = []
    try:
        agent = Agent(["--spool-dir", str(slurm_cluster.spool_dir),
                       "--state-dir", str(work / "state"), "--sample-interval", "1",
                       "--slurm-lookup", "cli", "--node-name", slurm_cluster.node_name],
                      env={**fake.env(), **slurm_cluster.env}, log_path=work / "agent.log")
        started.append(agent)
        prom = Prometheus("prometheus", {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "slurm-gpu", "static_configs": [
                {"targets": [f"127.0.0.1:{agent.port}"]}]}]}, work / "prom")
        started.append(prom)
        web, proxy_config, _ = write_configs(work)
        port = free_port()
        proxy = Daemon("proxy", [
            str(BIN / "slurm-gpu-proxy"), "--prometheus-url", prom.url,
            "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(web),
            "--config", str(proxy_config), "--admin", "root", "--munge",
            # the GPUs' sizes (no user label): the users' reports show them as root's do
            "--public-metric", "slurm_gpu_memory_total_bytes",
            f"--munge.socket={SITE_SOCKET}"], port, work)
        started.append(proxy)
        for thing in started:
            thing.wait_ready()
        for jobid in jobs.values():
            slurm_cluster.wait_state(jobid, "RUNNING", timeout=30)
        pid = wait_until(lambda: slurm_cluster.command_pid(jobs[OWNER], "sleep"), 15, "the sleep")
        gpus = wait_until(lambda: slurm_cluster.spool_gpus(jobs[OWNER]), 15, "the GPUs")
        devices[gpus[0]].processes = [Process(pid, 2 << 30, sm=Pattern.constant(100))]
        fake.write(NvmlState(devices=devices))
        for jobid in jobs.values():
            slurm_cluster.wait_finished(jobid, timeout=60)
        ids = "|".join(map(str, jobs.values()))
        prom.wait_for(f'count(last_over_time(slurm_job_end_time_seconds{{jobid=~"{ids}"}}'
                      "[10m])) == 2", timeout=30)
        client = public / "client.toml"
        client.write_text(f'prometheus_url = "{proxy.url}"\nauth = "munge"\n')
        client.chmod(0o644)
        yield Setup(slurm_cluster, prom, proxy, client, jobs)
    finally:
        for thing in reversed(started):
            thing.stop()
        for jobid in jobs.values():
            slurm_cluster.cancel(jobid)
        shutil.rmtree(public, ignore_errors=True)


def _figures(run: subprocess.CompletedProcess[str]) -> dict:
    assert run.returncode == 0, run.stderr
    (job,) = json.loads(run.stdout)["jobs"]
    return job


def test_owner_gets_through_the_proxy_what_root_gets_directly(setup: Setup) -> None:
    jobid = str(setup.jobs[OWNER])
    root = _figures(subprocess.run(
        [str(BIN / "slurm-gpu-report"), "job", jobid, "--format", "json",
         "--prometheus-url", setup.prometheus.url], capture_output=True, text=True,
        timeout=120, check=False, env={**setup.cluster.env, "SLURM_GPU_REPORT_CLIENT":
                                       "/nonexistent"}))
    # only the client config: the user types the job id alone
    mine = _figures(setup.as_user(OWNER, "job", jobid, "--format", "json"))
    assert mine["user"] == OWNER and mine["gpus"] == 2
    assert 0.2 < mine["busy_ratio"] < 0.55, mine
    for key in ("busy_ratio", "gpus", "gpu_hours", "idle_gpus", "gpu_memory_peak_gib",
                "energy_kwh", "run_time_s", "notes", "gpus_detail"):
        assert mine[key] == root[key], key
    # the contract's flags, without a client config
    flags = setup.as_user(OWNER, "job", jobid, "--format", "json", "--prometheus-url",
                          setup.proxy.url, "--auth", "munge", client=Path("/nonexistent"))
    assert _figures(flags)["busy_ratio"] == root["busy_ratio"]
    table = setup.as_user(OWNER, "job", jobid)
    assert table.returncode == 0 and jobid in table.stdout, table.stderr


def test_another_users_job_is_a_clear_refusal(setup: Setup) -> None:
    theirs = str(setup.jobs[OTHER])
    run = setup.as_user(OWNER, "job", theirs)
    assert run.returncode == 10, (run.returncode, run.stdout, run.stderr)
    assert f"job {theirs} is not yours ({OWNER})" in run.stderr, run.stderr
    assert run.stdout == ""


def test_without_munge_the_proxy_refuses_the_user(setup: Setup) -> None:
    plain = setup.client_config.with_name("plain.toml")
    plain.write_text(f'prometheus_url = "{setup.proxy.url}"\n')
    plain.chmod(0o644)
    run = setup.as_user(OWNER, "job", str(setup.jobs[OWNER]), client=plain)
    assert run.returncode == 4 and "HTTP 401" in run.stderr, run.stderr
