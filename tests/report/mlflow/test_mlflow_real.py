"""``slurm-gpu-report mlflow`` for real: a real MLflow tracking server with MLflow's
basic-auth app (SQLite stores, from .venv-mlflow) and a real Prometheus holding known
jobs and the runs their agents named (``slurm_job_mlflow_run_info``, backfilled with
promtool). The run of an ended job gets the figures ``job --format json`` shows, once;
a run that claims another user's job (its ``user_id`` and tag say so, the agent does
not) gets nothing; runs of running, unknown or earlier jobs stay pending, until they
expire; a run the writer may not edit, or a deleted one, stops no other; no credential
reaches the output. The first run is made by the training client inside a script
under the MLflow venv, as a training job makes it."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.daemons import REPO, Prometheus, tool
from tests.support.mlflow_server import ADMIN, MlflowServer

pytestmark = [pytest.mark.prometheus, pytest.mark.mlflow]

REPORT = str(Path(sys.executable).parent / "slurm-gpu-report")
HOUR = 3600
ME = getpass.getuser()  # the runs' MLflow user: the login name of who makes them
FACTOR = 300.0  # gCO2e/kWh
# jobid -> (user, GPUs, busy share, ended: hours before now, or None while running)
JOBS = {
    "8880001": (ME, 2, 0.6, 2),
    "8880002": ("bob", 1, 0.9, 2),
    "8880003": (ME, 1, 0.5, None),
    "8880004": (ME, 1, 0.5, 10),
    "8880005": ("alice", 1, 0.5, 2),
}
UNKNOWN_JOB = "8889999"
OLD_UNKNOWN_JOB = "8889998"
# MLflow's client makes the signed-in user the run's user_id: the trainer signs in as ME.
TRAINER = (ME, "trainer-Secret-pw-1")
ALICE = ("alice", "alice-Secret-pw-2")
EDITOR = ("editor", "editor-Secret-pw-3")  # may edit experiment 0 only

TRAIN = """
import json, sys, mlflow
from slurm_gpu_exporter import training
mlflow.set_tracking_uri(sys.argv[1])
with mlflow.start_run() as run:
    training.step(1, samples=32, loss=0.5)
    training.close(5.0)
print(json.dumps({"run_id": run.info.run_id}))
"""


def _openmetrics(start: int, now: int, named: dict[str, list[tuple[str, str]]]) -> str:
    """Two hours of each job's series every 15 s, from ``start``, with the runs its
    agent named (``named``: jobid -> [(run id, experiment id)])."""
    rows: dict[str, list[str]] = {}
    for jobid, (user, gpus, busy, ended) in JOBS.items():
        job = f'jobid="{jobid}",user="{user}",instance="gpu01:9817",job="slurm-gpu"'
        for t in range(start, start + 2 * HOUR + 1, 15):
            held = t - start
            for run_id, experiment in named.get(jobid, []):
                rows.setdefault("run", []).append(
                    f'slurm_job_mlflow_run_info{{{job},run_id="{run_id}",'
                    f'experiment_id="{experiment}"}} 1 {t}')
            rows.setdefault("info", []).append(
                f'slurm_job_info{{{job},account="ml",partition="gpu",name="train"}} 1 {t}')
            rows.setdefault("start", []).append(
                f"slurm_job_start_time_seconds{{{job}}} {start} {t}")
            if ended is not None:
                rows.setdefault("end", []).append(
                    f"slurm_job_end_time_seconds{{{job}}} {now - ended * HOUR} {t}")
            for gpu in range(gpus):
                labels = f'{job},gpu="{gpu}",uuid="GPU-{jobid}-{gpu}"'
                for key, value in (("alloc", held), ("busy", busy * held),
                                   ("sm", 0.4 * held), ("tensor", 0.2 * held),
                                   ("energy", 250.0 * held)):
                    rows.setdefault(key, []).append(f"{_NAMES[key][0]}{{{labels}}} {value} {t}")
                rows.setdefault("mem", []).append(
                    f"slurm_job_gpu_memory_peak_bytes{{{labels}}} {(gpu + 1) * 2**30} {t}")
                rows.setdefault("throttled", []).append(
                    f'slurm_job_gpu_throttled_seconds_total{{{labels},reason="power"}} '
                    f"{0.1 * held} {t}")
    lines = []
    for key, (name, kind) in _NAMES.items():
        family = name.removesuffix("_total") if kind == "counter" else name
        lines.append(f"# TYPE {family} {kind}")
        lines.extend(rows[key])
    return "\n".join(lines) + "\n# EOF\n"


_NAMES = {
    "info": ("slurm_job_info", "gauge"),
    "start": ("slurm_job_start_time_seconds", "gauge"),
    "end": ("slurm_job_end_time_seconds", "gauge"),
    "alloc": ("slurm_job_gpu_allocated_seconds_total", "counter"),
    "busy": ("slurm_job_gpu_busy_seconds_total", "counter"),
    "sm": ("slurm_job_gpu_sm_active_seconds_total", "counter"),
    "tensor": ("slurm_job_gpu_tensor_active_seconds_total", "counter"),
    "energy": ("slurm_job_gpu_energy_joules_total", "counter"),
    "mem": ("slurm_job_gpu_memory_peak_bytes", "gauge"),
    "throttled": ("slurm_job_gpu_throttled_seconds_total", "counter"),
    "run": ("slurm_job_mlflow_run_info", "gauge"),
}


@dataclass
class Rig:
    prom: Prometheus
    mlflow: MlflowServer
    runs: dict[str, str]  # what each run claims -> its run id
    config: Path


def _create_run(mlflow: MlflowServer, user: str, tags: dict[str, str],
                experiment: str = "0", as_user: tuple[str, str] | None = None,
                started: float | None = None) -> str:
    """A run made through the REST API claiming ``user_id`` ``user``, signed in as
    ``as_user`` (the admin unless told): MLflow stores what the client says, signed in
    or not."""
    run = mlflow.api("runs/create", {
        "experiment_id": experiment, "user_id": user,
        "start_time": int((started or time.time()) * 1000),
        "tags": [{"key": k, "value": v} for k, v in tags.items()]}, as_user=as_user)
    return str(run["run"]["info"]["run_id"])


def _pending(jobid: str) -> dict[str, str]:
    return {"slurm.job_id": jobid, "slurm.figures": "pending"}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    work = tmp_path_factory.mktemp("mlflow-real")
    now = int(time.time())
    start = (now - 4 * HOUR) // 60 * 60
    mlflow = MlflowServer(work / "mlflow", basic_auth=True)
    prom = None
    try:
        mlflow.wait_ready()
        for user in (TRAINER, ALICE, EDITOR):
            mlflow.create_user(*user)
        for user in (TRAINER, EDITOR):
            mlflow.grant(user[0], "0")
        trained = subprocess.run(
            [str(mlflow.python), "-c", TRAIN, mlflow.url], capture_output=True, text=True,
            timeout=120, check=True, cwd=work,
            env={**os.environ, "PYTHONPATH": str(REPO), "SLURM_JOB_ID": "8880001",
                 "SLURM_CLUSTER_NAME": "alpha", "SLURM_GPU_EXPORTER_SPOOL_DIR": str(work),
                 "SLURM_GPU_DASHBOARD_URL": "https://grafana.example.org/d/job?orgId=1",
                 "MLFLOW_TRACKING_USERNAME": TRAINER[0],
                 "MLFLOW_TRACKING_PASSWORD": TRAINER[1]})
        runs = {"8880001": json.loads(trained.stdout.strip().splitlines()[-1])["run_id"]}
        runs["8880001 deleted"] = _create_run(mlflow, ME, _pending("8880001"))
        mlflow.api("runs/delete", {"run_id": runs["8880001 deleted"]})
        runs["bob's own"] = _create_run(mlflow, "bob", _pending("8880002"))
        runs["bob's job"] = _create_run(mlflow, ME, _pending("8880002"))
        for jobid in ("8880003", "8880004", UNKNOWN_JOB):
            runs[jobid] = _create_run(mlflow, ME, _pending(jobid))
        runs["expired"] = _create_run(mlflow, ME, _pending(OLD_UNKNOWN_JOB),
                                      started=now - 8 * 86400)
        runs["untagged"] = _create_run(mlflow, ME, {})
        # alice, signed in as herself, in her own experiment, claims bob and his job:
        # once with a run no agent named, once with a run her own job's agent named.
        hers = str(mlflow.api("experiments/create", {"name": "alice"},
                              as_user=ALICE)["experiment_id"])
        for name in ("alice unnamed", "alice named"):
            runs[name] = _create_run(mlflow, "bob", _pending("8880002"), hers, ALICE)
        named = {"8880001": [(runs["8880001"], "0"), (runs["8880001 deleted"], "0")],
                 "8880002": [(runs["bob's own"], "0")],
                 "8880003": [(runs["8880003"], "0")], "8880004": [(runs["8880004"], "0")],
                 "8880005": [(runs["alice named"], hers)]}
        source = work / "backfill.om"
        source.write_text(_openmetrics(start, now, named))
        subprocess.run([tool("promtool", package="prometheus"), "tsdb", "create-blocks-from",
                        "openmetrics", str(source), str(work / "prom" / "data")],
                       check=True, capture_output=True, timeout=120)
        prom = Prometheus("prometheus", {"global": {"scrape_interval": "15s"},
                                         "scrape_configs": []}, work / "prom")
        prom.wait_ready()
        prom.wait_for('slurm_job_info{jobid="8880004"}[6h]', timeout=60)
        config = work / "report.toml"
        config.write_text(f"[energy]\nemissions_gco2e_per_kwh = {FACTOR}\n")
        yield Rig(prom, mlflow, runs, config)
    finally:
        if prom is not None:
            prom.stop()
        mlflow.stop()


def _signed_in(who: tuple[str, str]) -> dict[str, str]:
    return {**os.environ, "MLFLOW_TRACKING_USERNAME": who[0],
            "MLFLOW_TRACKING_PASSWORD": who[1]}


def _report(rig: Rig, *args: str, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([REPORT, *args, "--prometheus-url", rig.prom.url, "--no-sacct",
                           "--config", str(rig.config)], env=env or _signed_in(ADMIN),
                          capture_output=True, text=True, timeout=120, check=False)


def _write(rig: Rig, *args: str) -> subprocess.CompletedProcess[str]:
    done = _report(rig, "mlflow", "--tracking-uri", rig.mlflow.url, "--since", "6h", *args)
    assert done.returncode == 0, done.stderr
    return done


def test_the_training_client_tags_its_run_with_the_job(rig: Rig) -> None:
    tags = rig.mlflow.run(rig.runs["8880001"])["tags"]
    assert {k: v for k, v in tags.items() if k.startswith("slurm.")} == {
        "slurm.job_id": "8880001", "slurm.cluster": "alpha", "slurm.figures": "pending",
        "slurm.dashboard": "https://grafana.example.org/d/job?orgId=1&var-jobid=8880001"}


def test_a_dry_run_says_what_it_would_write_and_writes_nothing(rig: Rig) -> None:
    done = _write(rig, "--dry-run")
    assert f"would wrote the job's figures into run {rig.runs['8880001']}" not in done.stdout
    assert f"would write the job's figures into run {rig.runs['8880001']}" in done.stdout
    assert ("dry run: 2 runs given their job's figures, 3 refused (not the run of the job "
            "it names), 1 expired, 3 left pending, 0 not writable") in done.stdout, done.stdout
    for run_id in rig.runs.values():
        assert rig.mlflow.run(run_id)["history"] == {}


def test_a_run_the_writer_may_not_edit_is_skipped_and_the_rest_written(rig: Rig) -> None:
    """The editor may edit experiment 0, not alice's: her two runs answer 403 and are
    counted; a deleted run is not looked at; every other run is written."""
    done = _report(rig, "mlflow", "--tracking-uri", rig.mlflow.url, "--since", "6h",
                   env=_signed_in(EDITOR))
    assert done.returncode == 11, done.stderr
    assert ("2 runs given their job's figures, 1 refused (not the run of the job it "
            "names), 1 expired, 3 left pending, 2 not writable (2 forbidden); 9 pending "
            "runs looked at") in done.stdout, done.stdout
    for name in ("alice unnamed", "alice named"):
        assert f"run {rig.runs[name]} (experiment " in done.stderr
        assert rig.mlflow.run(rig.runs[name])["tags"]["slurm.figures"] == "pending"
    assert "grant the writer's MLflow user EDIT" in done.stderr
    assert EDITOR[1] not in done.stdout + done.stderr
    assert rig.mlflow.run(rig.runs["8880001"])["tags"]["slurm.figures"] == "written"
    assert rig.mlflow.run(rig.runs["bob's own"])["tags"]["slurm.figures"] == "written"
    deleted = rig.mlflow.run(rig.runs["8880001 deleted"])
    assert deleted["history"] == {} and deleted["tags"]["slurm.figures"] == "pending"


def test_the_ended_jobs_run_gets_the_job_reports_figures_once(rig: Rig) -> None:
    _report(rig, "mlflow", "--tracking-uri", rig.mlflow.url, "--since", "6h",
            env=_signed_in(EDITOR))
    job = _report(rig, "job", "8880001", "--format", "json")
    assert job.returncode == 0, job.stderr
    [shown] = json.loads(job.stdout)["jobs"]
    run = rig.mlflow.run(rig.runs["8880001"])
    got = {k: v[-1]["value"] for k, v in run["history"].items()}
    want = {
        "slurm.gpu_hours": shown["gpu_hours"],
        "slurm.gpu_busy_ratio": shown["busy_ratio"],
        "slurm.sm_active_ratio": shown["sm_active_ratio"],
        "slurm.tensor_active_ratio": shown["tensor_active_ratio"],
        "slurm.gpu_memory_peak_bytes": shown["gpu_memory_peak_gib"] * 2**30,
        "slurm.gpu_energy_joules": shown["energy_kwh"] * 3.6e6,
        "slurm.emissions_grams": shown["emissions_gco2e"],
        "slurm.gpus": shown["gpus"],
        "slurm.idle_gpus": shown["idle_gpus"],
        "slurm.run_time_seconds": shown["run_time_s"],
    }
    assert shown["busy_ratio"] == pytest.approx(0.6, rel=1e-3)  # the backfilled truth
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9), key
    assert got["slurm.gpu_throttled_ratio.power"] == pytest.approx(0.1, rel=1e-3)
    assert run["tags"]["slurm.figures"] == "written"
    assert run["tags"]["slurm.user"] == ME and run["tags"]["slurm.job"] == "8880001"

    _write(rig)  # the admin refuses alice's runs
    again = _write(rig)
    assert ("0 runs given their job's figures, 0 refused (not the run of the job it "
            "names), 0 expired, 3 left pending, 0 not writable (0 forbidden); 3 pending "
            "runs looked at") in again.stdout, again.stdout
    history = rig.mlflow.run(rig.runs["8880001"])["history"]
    assert {k: len(v) for k, v in history.items()} == dict.fromkeys(history, 1)


def test_bobs_own_run_named_by_his_jobs_agent_gets_his_figures(rig: Rig) -> None:
    _write(rig)
    run = rig.mlflow.run(rig.runs["bob's own"])
    assert run["tags"]["slurm.figures"] == "written" and run["tags"]["slurm.user"] == "bob"
    assert run["history"]["slurm.gpu_busy_ratio"][-1]["value"] == pytest.approx(0.9, rel=1e-3)


def test_a_run_claiming_another_users_job_gets_nothing(rig: Rig) -> None:
    _write(rig)
    run = rig.mlflow.run(rig.runs["bob's job"])
    assert run["history"] == {}
    assert run["tags"]["slurm.figures"] == "refused"
    assert run["tags"]["slurm.figures_refused"] == (
        "job 8880002 ended and its agent never named this run (slurm_job_mlflow_run_info)")


def test_alice_claiming_bobs_user_and_job_gets_nothing(rig: Rig) -> None:
    """Signed in as herself, alice made runs whose user_id says bob and whose tag names
    bob's ended job: MLflow keeps both as she sent them; the agents named neither for
    bob's job (one for her own), so both are refused and get none of bob's figures."""
    _write(rig)
    unnamed = rig.mlflow.run(rig.runs["alice unnamed"])
    assert unnamed["info"]["user_id"] == "bob"  # what a client says is what MLflow keeps
    named = rig.mlflow.run(rig.runs["alice named"])
    for run in (unnamed, named):
        assert run["history"] == {}
        assert run["tags"]["slurm.figures"] == "refused"
        assert not {"slurm.user", "slurm.job", "slurm.account"} & set(run["tags"])
    assert named["tags"]["slurm.figures_refused"] == (
        "the run says job 8880002, but the agent named it for job 8880005")


def test_a_pending_run_nobody_fills_expires_after_its_bound(rig: Rig) -> None:
    """Started 8 days ago (the default bound is 7), its job unknown: marked expired, and
    not asked about again; a fresh run of an unknown job still waits."""
    _write(rig)
    run = rig.mlflow.run(rig.runs["expired"])
    assert run["history"] == {} and run["tags"]["slurm.figures"] == "expired"
    assert "more than 7 days ago" in run["tags"]["slurm.figures_expired"]
    assert rig.mlflow.run(rig.runs[UNKNOWN_JOB])["tags"]["slurm.figures"] == "pending"


@pytest.mark.parametrize("jobid", ["8880003", "8880004", UNKNOWN_JOB])
def test_runs_of_running_earlier_or_unknown_jobs_stay_pending(rig: Rig, jobid: str) -> None:
    _write(rig)
    run = rig.mlflow.run(rig.runs[jobid])
    assert run["history"] == {} and run["tags"]["slurm.figures"] == "pending"


def test_an_unreachable_tracking_server_is_one_line_and_exit_3(rig: Rig) -> None:
    done = _report(rig, "mlflow", "--tracking-uri", "http://127.0.0.1:9", "--since", "6h")
    assert done.returncode == 3
    assert done.stderr.startswith("slurm-gpu-report: cannot reach MLflow at "
                                  "http://127.0.0.1:9") and done.stderr.count("\n") == 1


SECRET = "pw-Secret-in-URL-7"


@pytest.mark.parametrize(("uri", "password", "status"), [
    ("http://{admin}:{password}@{host}", ADMIN[1], 0),  # the URL's credentials sign in
    ("http://{admin}:{password}@{host}", SECRET, 3),  # a wrong password: 401
    ("http://{admin}:{password}@127.0.0.1:9", SECRET, 3),  # unreachable
    ("ftp://{admin}:{password}@{host}", SECRET, 2),  # not an http URL
])
def test_credentials_in_the_tracking_uri_never_reach_the_output(
        rig: Rig, uri: str, password: str, status: int) -> None:
    given = uri.format(admin=ADMIN[0], password=password,
                       host=rig.mlflow.url.removeprefix("http://"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    done = _report(rig, "mlflow", "--tracking-uri", given, "--since", "6h", "--dry-run",
                   "-v", env=env)
    assert done.returncode == status, done.stderr
    assert password not in done.stdout + done.stderr
    assert f"{ADMIN[0]}:" not in done.stdout + done.stderr


def test_a_wrong_password_from_the_environment_is_never_printed(rig: Rig) -> None:
    done = _report(rig, "mlflow", "--tracking-uri", rig.mlflow.url, "--since", "6h",
                   env=_signed_in((ADMIN[0], SECRET)))
    assert done.returncode == 3 and "answered 401" in done.stderr, done.stderr
    assert SECRET not in done.stdout + done.stderr


def test_a_password_beyond_ascii_signs_in_to_the_real_server(rig: Rig) -> None:
    # MLflow's server reads Basic credentials as UTF-8; the writer must send them so.
    import asyncio

    from slurm_gpu_exporter.report.mlflow.tracking import TrackingServer

    user = ("umlaut", "grünes-Gras-€-42")
    rig.mlflow.create_user(*user)

    async def sign_in() -> list[str]:
        env = {"MLFLOW_TRACKING_USERNAME": user[0], "MLFLOW_TRACKING_PASSWORD": user[1]}
        async with TrackingServer(rig.mlflow.url, 30.0, env) as tracking:
            return await tracking.experiment_ids()
    assert "0" in asyncio.run(sign_in())
