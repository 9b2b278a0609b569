"""A job older than Prometheus' retention, on the real cluster: sgeuser's and sgeuser2's
GPU jobs run, are scraped by a real Prometheus and archived by ``slurm-gpu-report
archive`` (with sacct); then a new, empty Prometheus (the data past retention) behind
the real ``slurm-gpu-proxy --munge --archive.url``. sgeuser runs ``slurm-gpu-report
job`` as sgeuser (runuser, a munge credential per request from the cluster's munged)
and gets her archived figures; sgeuser2's job is a clear refusal; root through the
proxy gets the figures ``job --db`` gives."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.proxy.stack import request
from tests.support import job_figures
from tests.support.daemons import Daemon, Prometheus
from tests.support.munge import for_proxy
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

pytestmark = [pytest.mark.process, pytest.mark.slurm, pytest.mark.fakenvml,
              pytest.mark.prometheus]


@dataclass
class Setup:
    cluster: SlurmCluster
    empty: Prometheus
    proxy: Daemon
    db: str
    client_config: Path
    jobs: dict[str, int]  # user -> job id

    def as_user(self, user: str, *args: str) -> subprocess.CompletedProcess[str]:
        return report_as_user(self.cluster, user, self.client_config, *args)

    def as_root(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "slurm-gpu-report"), *args], capture_output=True,
                              text=True, timeout=120, check=False,
                              env={**self.cluster.env, "PATH": "/usr/bin:/bin",
                                   "SLURM_GPU_REPORT_CLIENT": "/nonexistent"})


@pytest.fixture(scope="module")
def setup(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Setup]:
    work = tmp_path_factory.mktemp("user-archive")
    public = Path(tempfile.mkdtemp(prefix="sge-client-", dir="/tmp"))
    public.chmod(0o755)
    started: list = []
    jobs: dict[str, int] = {}
    try:
        jobs, live = run_gpu_jobs(slurm_cluster, work, started, 12)
        slurm_cluster.wait_accounted(jobs.values())
        db = f"sqlite:///{work / 'archive.sqlite'}"
        archived = subprocess.run([str(BIN / "slurm-gpu-report"), "archive", "--since", "10m",
                                   "--db", db, "--prometheus-url", live.url],
                                  capture_output=True, text=True, timeout=120, check=False,
                                  env={**slurm_cluster.env, "PATH": "/usr/bin:/bin"})
        assert archived.returncode == 0, archived.stderr
        live.stop()
        empty = Prometheus("prometheus-empty", {"global": {"scrape_interval": "15s"}},
                           work / "prom-empty")
        started.append(empty)
        proxy = start_proxy(empty.url, work, "--archive.url", db)
        started.append(proxy)
        empty.wait_ready()
        proxy.wait_ready()
        client = write_client_config(public, proxy.url)
        yield Setup(slurm_cluster, empty, proxy, db, client, jobs)
    finally:
        for thing in reversed(started):
            thing.stop()
        for jobid in jobs.values():
            slurm_cluster.cancel(jobid)
        shutil.rmtree(public, ignore_errors=True)


def _without_notes(job: dict) -> dict:
    return {k: v for k, v in job.items() if k != "notes"}


def test_the_owner_gets_her_archived_job_and_root_the_same_figures(setup: Setup) -> None:
    jobid = str(setup.jobs[OWNER])
    direct = job_figures(setup.as_root("job", jobid, "--format", "json", "--db", setup.db,
                                       "--prometheus-url", setup.empty.url))
    mine = job_figures(setup.as_user(OWNER, "job", jobid, "--format", "json"))
    assert mine["user"] == OWNER and mine["gpus"] == 2
    assert 0.2 < mine["busy_ratio"] < 0.55, mine
    assert mine["notes"][0].startswith(f"From the job archive (through {setup.proxy.url}, ")
    assert _without_notes(mine) == _without_notes(direct)
    assert mine["notes"][1:] == direct["notes"][1:]
    root = job_figures(setup.as_root("job", jobid, "--format", "json", "--prometheus-url",
                                     setup.proxy.url, "--auth", "munge"))
    assert root == mine
    table = setup.as_user(OWNER, "job", jobid)
    assert table.returncode == 0 and "From the job archive" in table.stdout, table.stderr


def test_another_users_archived_job_is_a_clear_refusal(setup: Setup) -> None:
    theirs = str(setup.jobs[OTHER])
    run = setup.as_user(OWNER, "job", theirs)
    assert run.returncode == 10, (run.returncode, run.stdout, run.stderr)
    assert f"job {theirs} is not yours ({OWNER})" in run.stderr, run.stderr
    assert run.stdout == ""
    # the endpoint itself, with the other user's own munge credential
    url = f"{setup.proxy.url}/slurm-gpu/v1/jobs/{setup.jobs[OWNER]}"
    answer = request(url, {"Authorization": f"Munge {for_proxy(OTHER, setup.proxy.url)}"})
    assert answer.status == 403 and answer.body["errorType"] == "not_yours", answer.text
    assert OWNER not in answer.text
    own = request(url, {"Authorization": f"Munge {for_proxy(OWNER, setup.proxy.url)}"})
    assert own.status == 200 and own.body["data"]["jobs"][0]["user"] == OWNER
