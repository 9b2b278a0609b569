"""slurm-gpu-proxy --archive.url: the real proxy in front of a real, empty Prometheus
(every job here is past its retention) and a job archive in SQLite and in a real
PostgreSQL. ``GET /slurm-gpu/v1/jobs/<jobid>`` shows a user their own archived jobs (a
coordinator their accounts' users', an admin all), refuses another user's with 403,
a missing job with 404 and a hostile id with 400; ``slurm-gpu-report job`` signed in
through the proxy falls back to it and renders what ``job --db`` renders."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_gpu_exporter.report.archive.rows import ArchiveRecord
from slurm_gpu_exporter.report.archive.store import ArchiveStore
from slurm_gpu_exporter.report.figures.detail_data import detail_from_data
from slurm_gpu_exporter.report.figures.shapes import (
    Accounting,
    GpuDetail,
    JobDetail,
    JobUsage,
    NodeDetail,
)
from tests.proxy.stack import Answer, basic, password, request, write_configs
from tests.report.pgserver import PostgresServer
from tests.support import free_port, job_figures
from tests.support.daemons import Daemon, Prometheus, tool

pytestmark = [pytest.mark.process, pytest.mark.prometheus]

BIN = Path(sys.executable).parent
ENDED = 1_700_000_000.0  # long past any retention
JOBS = {"4242": "alice", "4343": "bob", "4444": "dave"}  # dave: in carol's account ml


def _detail(jobid: str, user: str) -> JobDetail:
    gpus = [GpuDetail(gpu=str(i), uuid=f"GPU-{jobid}-{i}", allocated_s=3600.0,
                      busy_s=900.0 * (i + 1), memory_peak=float(2 << 30),
                      memory_total=float(80 << 30), energy_j=360_000.0,
                      sm_active_s=700.0, tensor_active_s=120.0, dram_active_s=300.0)
            for i in range(2)]
    usage = JobUsage(jobid=jobid, user=user, account="ml", partition="gpu", name="train",
                     cluster="testcluster", gpus=2, allocated_s=7200.0, busy_s=2700.0,
                     gpu_memory_peak=float(2 << 30), start=ENDED - 3600, end=ENDED,
                     sm_active_s=1400.0, gpm_allocated_s=7200.0, tensor_active_s=240.0,
                     dram_active_s=600.0)
    node = NodeDetail(node="gpu01", cpus=8, cpu_s=7200.0, memory_peak=float(4 << 30),
                      memory_limit=float(16 << 30), gpus=gpus)
    accounting = Accounting(state="COMPLETED", time_limit_s=7200.0, cpus=8, nodes=1,
                            start=ENDED - 3600, end=ENDED, exit_code="0:0", account="ml")
    return JobDetail(usage=usage, nodes=[node], accounting=accounting, now=ENDED,
                     notes=["1 of 2 GPUs mostly idle"])


@dataclass
class Stack:
    db: str
    prometheus: Prometheus
    proxy: Daemon
    work: Path

    def get(self, path: str, user: str | None = "alice", method: str = "GET") -> Answer:
        return request(f"{self.proxy.url}{path}", basic(user) if user else {}, method=method)

    def report(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "slurm-gpu-report"), *args, "--no-sacct",
                               "--format", "json"], capture_output=True, text=True,
                              timeout=120, check=False,
                              env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
                                   "SLURM_GPU_REPORT_CLIENT": "/nonexistent"})

    def as_user(self, user: str, *args: str) -> subprocess.CompletedProcess[str]:
        secret = self.work / f"{user}.password"
        secret.write_text(password(user) + "\n")
        return self.report(*args, "--prometheus-url", self.proxy.url, "--username", user,
                           "--password-file", str(secret))


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Stack]:
    tool("prometheus", package="prometheus")
    work = tmp_path_factory.mktemp(f"archive-endpoint-{request.param}")
    started: list = []
    try:
        if request.param == "sqlite":
            db = f"sqlite:///{work / 'archive.sqlite'}"
        else:
            pg = PostgresServer()
            started.append(pg)
            db = pg.create_database("archive")
        with ArchiveStore(db, write=True) as store:
            store.store([ArchiveRecord(_detail(j, u)) for j, u in JOBS.items()], ENDED + 60)
        prom = Prometheus("prometheus", {"global": {"scrape_interval": "15s"}}, work / "prom")
        started.append(prom)
        web, proxy_config, _ = write_configs(work)
        port = free_port()
        proxy = Daemon("proxy", [
            str(BIN / "slurm-gpu-proxy"), "--prometheus-url", prom.url,
            "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(web),
            "--config", str(proxy_config), "--admin", "root", "--archive.url", db], port, work)
        started.append(proxy)
        prom.wait_ready()
        proxy.wait_ready()
        yield Stack(db, prom, proxy, work)
    finally:
        for thing in reversed(started):
            thing.stop()


def _jobs(answer: Answer) -> list[dict]:
    assert answer.status == 200, answer.text
    return answer.body["data"]["jobs"]


def test_the_owner_gets_the_archived_job_as_stored(stack: Stack) -> None:
    (job,) = _jobs(stack.get("/slurm-gpu/v1/jobs/4242"))
    assert (job["user"], job["cluster"], job["archived_at"]) == ("alice", "testcluster",
                                                                 ENDED + 60)
    with ArchiveStore(stack.db, write=False) as store:
        ((stored, _),) = store.details(["4242"])["4242"]
    assert detail_from_data(job["detail"]) == stored
    (again,) = _jobs(stack.get("/slurm-gpu/v1/jobs/4242?cluster=testcluster"))
    assert again == job
    assert stack.get("/slurm-gpu/v1/jobs/4242?cluster=other").status == 404


def test_another_users_job_is_refused_and_admins_and_coordinators_see_theirs(
        stack: Stack) -> None:
    refused = stack.get("/slurm-gpu/v1/jobs/4242", user="bob")
    assert refused.status == 403, refused.text
    assert refused.body["errorType"] == "not_yours"
    assert "job 4242 is not yours" in refused.body["error"]
    assert "testcluster" not in refused.text and "gpu01" not in refused.text
    assert _jobs(stack.get("/slurm-gpu/v1/jobs/4242", user="root")) == \
        _jobs(stack.get("/slurm-gpu/v1/jobs/4242"))
    assert _jobs(stack.get("/slurm-gpu/v1/jobs/4444", user="carol"))[0]["user"] == "dave"
    assert stack.get("/slurm-gpu/v1/jobs/4242", user="carol").status == 403


def test_missing_jobs_hostile_ids_and_strangers(stack: Stack) -> None:
    missing = stack.get("/slurm-gpu/v1/jobs/999")
    assert (missing.status, missing.body["errorType"]) == (404, "not_archived")
    for hostile in ("0", "-1", "4242%20OR%201=1", "4242'", "4242%27--", "1_", "1+",
                    "4242_1_2", "12345678901234", "%00", "4242%0a", "4242.0", "4.2e3",
                    "%E2%81%B4%E2%82%82"):
        answer = stack.get(f"/slurm-gpu/v1/jobs/{hostile}")
        assert (answer.status, answer.body["errorType"]) == (400, "bad_jobid"), hostile
    for path in ("/slurm-gpu/v1/jobs/4242/x", "/slurm-gpu/v1/jobs/", "/slurm-gpu/v1/jobs/..",
                 "/slurm-gpu/v2/jobs/4242"):
        answer = stack.get(path, user="root")  # not passed on to Prometheus, even for admins
        assert answer.status in (400, 404) and answer.body["status"] == "error", path
    for query in ("?cluster=a'b", "?x=1", "?cluster=a&cluster=b"):
        assert stack.get(f"/slurm-gpu/v1/jobs/4242{query}").status == 400, query
    assert stack.get("/slurm-gpu/v1/jobs/4242", method="POST").status == 405
    stranger = stack.get("/slurm-gpu/v1/jobs/4242", user=None)
    assert stranger.status == 401 and "gpu01" not in stranger.text
    wrong = request(f"{stack.proxy.url}/slurm-gpu/v1/jobs/4242", basic("alice", "guess"))
    assert wrong.status == 401


def test_job_through_the_proxy_renders_what_job_db_renders(stack: Stack) -> None:
    direct = job_figures(stack.report("job", "4242", "--db", stack.db, "--prometheus-url",
                                      stack.prometheus.url))
    mine = job_figures(stack.as_user("alice", "job", "4242"))
    root = job_figures(stack.as_user("root", "job", "4242"))
    assert mine["notes"][0].startswith(f"From the job archive (through {stack.proxy.url}, ")
    assert direct["notes"][0].startswith("From the job archive (")
    for figures in (mine, root):
        assert {k: v for k, v in figures.items() if k != "notes"} == \
            {k: v for k, v in direct.items() if k != "notes"}
        assert figures["notes"][1:] == direct["notes"][1:] == ["1 of 2 GPUs mostly idle"]
    assert mine["busy_ratio"] == pytest.approx(0.375)


def test_job_refuses_another_users_archived_job_clearly(stack: Stack) -> None:
    run = stack.as_user("bob", "job", "4242")
    assert run.returncode == 10, (run.returncode, run.stdout, run.stderr)
    assert "job 4242 is not yours" in run.stderr and run.stdout == ""
    both = stack.as_user("bob", "job", "4343", "4242", "4343")  # the own one shown once
    assert both.returncode == 10 and "job 4242 is not yours" in both.stderr
    assert [j["job"] for j in json.loads(both.stdout)["jobs"]] == ["4343"]
    unknown = stack.as_user("alice", "job", "999")
    assert unknown.returncode == 5 and "no metrics for job 999" in unknown.stderr


def test_a_plain_prometheus_has_no_archive_and_the_job_stays_unknown(stack: Stack) -> None:
    run = stack.report("job", "4242", "--prometheus-url", stack.prometheus.url)
    assert run.returncode == 5, run.stderr
    assert run.stderr.strip().splitlines() == [
        "slurm-gpu-report: no metrics for job 4242 in Prometheus in the window; check the "
        "id, or widen it with --since"]
