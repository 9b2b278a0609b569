"""End to end: a training script in a real Slurm job logs an MLflow run to a real
tracking server; the real agent (over the fake NVML) names the run in
``slurm_job_mlflow_run_info``, Prometheus scrapes it, and after the job ends
``slurm-gpu-report mlflow`` writes the job's figures into the run, equal to what
``slurm-gpu-report job`` says, once.

The script runs under the MLflow venv's python (.venv-mlflow: mlflow and
prometheus-client, not the package) with only the client's two modules on PYTHONPATH,
copied where the job's user can read them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import slurm_gpu_exporter
from tests.fakenvml import Device, Pattern, Process
from tests.support import wait_until
from tests.support.agent import series
from tests.support.mlflow_server import MlflowServer
from tests.support.rig import Rig
from tests.support.slurmcluster import SBIN_PATH, SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.fakenvml, pytest.mark.prometheus,
              pytest.mark.mlflow]

REPORT = str(Path(sys.executable).parent / "slurm-gpu-report")
RUN_INFO = "slurm_job_mlflow_run_info"
SECONDS = 25  # the job's training loop

TRAIN_PY = """\
import sys, time
import mlflow
from slurm_gpu_exporter import training

mlflow.set_tracking_uri(sys.argv[1])
with mlflow.start_run() as run:
    training.step(1, samples=32, loss=1.0)
    print("ready", run.info.run_id, flush=True)
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        mlflow.log_metric("loss", 0.5)
        training.step(1, samples=32, loss=0.5)
        time.sleep(0.5)
training.close(2.0)
print("done", flush=True)
"""


@pytest.fixture
def client_dir() -> Iterator[Path]:
    """The client's modules and the script, where every job's user can read them."""
    base = Path(tempfile.mkdtemp(prefix="sge-mlflow-client-", dir="/var/tmp"))
    try:
        package = base / "slurm_gpu_exporter"
        package.mkdir()
        source = Path(slurm_gpu_exporter.__file__).parent
        for name in ("__init__.py", "training.py", "training_mlflow.py"):
            shutil.copy(source / name, package / name)
        (base / "train.py").write_text(TRAIN_PY)
        for path in [base, *base.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([REPORT, *args, "--no-sacct"], capture_output=True, text=True,
                          timeout=120, check=False)


def test_a_jobs_mlflow_run_is_named_by_the_agent_and_gets_its_figures_once(
        slurm_cluster: SlurmCluster, client_dir: Path, tmp_path: Path) -> None:
    cluster = slurm_cluster
    mlflow = MlflowServer(tmp_path / "mlflow")
    path = os.environ.get("PATH", "")
    rig = jobid = None
    try:
        # Slurm's GPU indices (minor numbers) run the other way round from NVML's.
        devices = [Device(index=i, minor=3 - i) for i in range(4)]
        rig = Rig(tmp_path, cluster=cluster, devices=devices,
                  extra_args=["--cgroup-root", str(cluster.cgroup_root), "--proc-root", "/proc",
                              "--job-linger", "5"],
                  env={"PATH": f"{path}:{SBIN_PATH}"})
        agent, prom = rig.agent, rig.prom
        mlflow.wait_ready()
        script = (f"#!/bin/sh\nexport SLURM_GPU_EXPORTER_SPOOL_DIR={cluster.spool_dir}\n"
                  f"export PYTHONPATH={client_dir}\nexport HOME=$(mktemp -d)\n"
                  f"exec {mlflow.python} {client_dir / 'train.py'} {mlflow.url} {SECONDS}\n")
        jobid = cluster.submit(script, user="sgeuser", gres="gpu:1")
        cluster.wait_state(jobid, "RUNNING", timeout=30)
        out = cluster.wait_output(jobid, "ready ", timeout=90)
        run_id = out.split("ready ", 1)[1].split()[0]
        # The job's python works its GPU at 60 %.
        record = json.loads((cluster.spool_dir / f"{jobid}.json").read_text())
        held = int(record["job_gpus"])
        pids = sorted(cluster.job_pids(jobid, "batch"))
        rig.devices[3 - held].processes = [Process(pids[-1], 1 << 30,
                                                   sm=Pattern.constant(60))]
        rig.write_nvml()

        def named() -> list[dict[str, str]]:
            return [labels for labels, _ in series(agent.metrics(), RUN_INFO)
                    if labels["jobid"] == str(jobid)]

        [labels] = wait_until(named, 30, "the agent naming the job's run", log=agent.log)
        assert labels == {"jobid": str(jobid), "user": "sgeuser", "run_id": run_id,
                          "experiment_id": "0"}
        prom.wait_for(f'{RUN_INFO}{{jobid="{jobid}",run_id="{run_id}"}}', timeout=30)
        tags = mlflow.run(run_id)["tags"]
        assert (tags["slurm.job_id"], tags["slurm.figures"]) == (str(jobid), "pending")

        cluster.wait_output(jobid, "done\n", timeout=SECONDS + 60)
        cluster.wait_finished(jobid, timeout=30)
        prom.wait_for(f'slurm_job_end_time_seconds{{jobid="{jobid}"}}[1m]', timeout=30)
        time.sleep(3)  # the last counters scraped before the series go

        wrote = _report("mlflow", "--tracking-uri", mlflow.url, "--prometheus-url",
                        prom.url, "--since", "1h")
        assert wrote.returncode == 0, wrote.stderr
        assert "1 runs given their job's figures" in wrote.stdout, wrote.stdout
        shown = _report("job", str(jobid), "--format", "json", "--prometheus-url", prom.url)
        assert shown.returncode == 0, shown.stderr
        [job] = json.loads(shown.stdout)["jobs"]
        run = mlflow.run(run_id)
        got = {k: v[-1]["value"] for k, v in run["history"].items()}
        assert got["slurm.gpu_hours"] == pytest.approx(job["gpu_hours"], rel=1e-9)
        assert got["slurm.gpu_busy_ratio"] == pytest.approx(job["busy_ratio"], rel=1e-9)
        assert 0.3 < got["slurm.gpu_busy_ratio"] <= 0.65  # 60 % once the process showed
        assert got["slurm.gpu_memory_peak_bytes"] == pytest.approx(
            job["gpu_memory_peak_gib"] * 2**30, rel=1e-9)
        assert run["tags"]["slurm.figures"] == "written"

        again = _report("mlflow", "--tracking-uri", mlflow.url, "--prometheus-url", prom.url,
                        "--since", "1h")
        assert again.returncode == 0, again.stderr
        assert "0 runs given their job's figures" in again.stdout, again.stdout
        history = mlflow.run(run_id)["history"]
        assert all(len(points) == 1 for key, points in history.items()
                   if key.startswith("slurm."))
    finally:
        if jobid is not None:
            cluster.cancel(jobid)
        if rig is not None:
            rig.stop()
        mlflow.stop()
