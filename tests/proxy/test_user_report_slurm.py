"""A user's own report through slurm-gpu-proxy --munge, on the real cluster: sgeuser
runs ``slurm-gpu-report job`` as sgeuser (runuser, a munge credential per request from
the cluster's munged, the real proxy and Prometheus) and gets the figures root gets
from Prometheus directly; for sgeuser2's job, a clear refusal."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import job_figures
from tests.support.daemons import Daemon, Prometheus
from tests.support.slurmcluster import SlurmCluster
from tests.support.user_jobs import (
    BIN,
    OTHER,
    OWNER,
    report_as_user,
    run_gpu_jobs,
    start_proxy,
    write_client_config,
)

pytestmark = [pytest.mark.process, pytest.mark.slurm, pytest.mark.every_release,
              pytest.mark.fakenvml,
              pytest.mark.prometheus]


@dataclass
class Setup:
    cluster: SlurmCluster
    prometheus: Prometheus
    proxy: Daemon
    client_config: Path
    jobs: dict[str, int]  # user -> job id

    def as_user(self, user: str, *args: str, client: Path | None = None
                ) -> subprocess.CompletedProcess[str]:
        return report_as_user(self.cluster, user, client or self.client_config, *args)


@pytest.fixture(scope="module")
def setup(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Setup]:
    work = tmp_path_factory.mktemp("user-report")
    # The users read their client configs here (pytest's directories are root's alone).
    public = Path(tempfile.mkdtemp(prefix="sge-client-", dir="/tmp"))
    public.chmod(0o755)
    started: list = []
    jobs: dict[str, int] = {}
    try:
        jobs, prom = run_gpu_jobs(slurm_cluster, work, started, 15)
        # the GPUs' sizes and each target's Slurm node (no user label): the users'
        # reports show them as root's do
        proxy = start_proxy(prom.url, work, "--public-metric", "slurm_gpu_memory_total_bytes",
                            "slurm_gpu_exporter_node_info")
        started.append(proxy)
        proxy.wait_ready()
        client = write_client_config(public, proxy.url)
        yield Setup(slurm_cluster, prom, proxy, client, jobs)
    finally:
        for thing in reversed(started):
            thing.stop()
        for jobid in jobs.values():
            slurm_cluster.cancel(jobid)
        shutil.rmtree(public, ignore_errors=True)


def test_owner_gets_through_the_proxy_what_root_gets_directly(setup: Setup) -> None:
    jobid = str(setup.jobs[OWNER])
    root = job_figures(subprocess.run(
        [str(BIN / "slurm-gpu-report"), "job", jobid, "--format", "json",
         "--prometheus-url", setup.prometheus.url], capture_output=True, text=True,
        timeout=120, check=False, env={**setup.cluster.env, "SLURM_GPU_REPORT_CLIENT":
                                       "/nonexistent"}))
    # only the client config: the user types the job id alone
    mine = job_figures(setup.as_user(OWNER, "job", jobid, "--format", "json"))
    assert mine["user"] == OWNER and mine["gpus"] == 2
    assert 0.2 < mine["busy_ratio"] < 0.55, mine
    for key in ("busy_ratio", "gpus", "gpu_hours", "idle_gpus", "gpu_memory_peak_gib",
                "energy_kwh", "run_time_s", "notes", "gpus_detail"):
        assert mine[key] == root[key], key
    # the contract's flags, without a client config
    flags = setup.as_user(OWNER, "job", jobid, "--format", "json", "--prometheus-url",
                          setup.proxy.url, "--auth", "munge", client=Path("/nonexistent"))
    assert job_figures(flags)["busy_ratio"] == root["busy_ratio"]
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
