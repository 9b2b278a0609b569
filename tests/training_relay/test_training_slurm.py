"""End to end: training scripts in real Slurm jobs publish through the real agent's relay.

The one-node Slurm 22.05 cluster (cgroup v1) runs batch jobs as sgeuser/sgeuser2; their
python3 imports the package's client (``slurm_gpu_exporter.training``, with
prometheus-client) from a copy made readable to every user, and pushes to
``training.sock`` in the cluster's spool dir. The agent (tests/support/agent.py) runs with
``--sample-interval 1 --job-linger 3`` and the relay on (the default).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import prometheus_client
import pytest

import slurm_gpu_exporter
from tests.agent.test_agent_slurm import (
    LINGER,
    Scrape,
    running_agent,
    scrape,
    wait_scrape,
)
from tests.support.agent import Agent, series
from tests.support.slurmcluster import SlurmCluster, SlurmError

DEMO = "slurm_job_training_demo_value"
STEPS = "slurm_job_training_steps_total"
MiB = 1 << 20

# A training loop: relay() a registry whose gauge carries a forged jobid label, and
# step() every 50 ms. Argv: value, forged jobid, seconds.
TRAIN_PY = """\
import sys, time
from prometheus_client import CollectorRegistry, Gauge
from slurm_gpu_exporter import training

value, forged, seconds = float(sys.argv[1]), sys.argv[2], float(sys.argv[3])
registry = CollectorRegistry()
gauge = Gauge("demo_value", "A value.", ["jobid", "user"], registry=registry)
gauge.labels(forged, "mallory").set(value)
# Two messages a push (this registry and step()'s): under the default 2 messages/s.
training.relay(registry, interval=1.5)
print("ready", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    training.step(1, samples=32, loss=0.5, lr=0.01)
    time.sleep(0.05)
"""

# A flood from one job: three processes push small messages at 10,000/s, 100 KB
# messages at 200/s and messages of 1,000 new series each at 100/s, never waiting.
FLOOD_PY = """\
import os, socket, sys, time

path = os.path.join(os.environ["SLURM_GPU_EXPORTER_SPOOL_DIR"], "training.sock")
seconds = float(sys.argv[1])

def payload(kind, i):
    if kind == "small":
        return b"flood_value %d\\n" % i
    if kind == "big":
        return b"# " + b"x" * 100000 + b"\\nbig 1\\n"
    return "".join('many{i="%d",j="%d"} 1\\n' % (i, j) for j in range(1000)).encode()

def flood(kind, rate):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(path)
    sock.setblocking(False)
    attempts = sent = 0
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        if attempts > elapsed * rate:
            time.sleep(0.001)
            continue
        attempts += 1
        try:
            sock.send(payload(kind, attempts))
            sent += 1
        except BlockingIOError:
            pass
    print(f"{kind} attempts={attempts} sent={sent} per_second={attempts / seconds:.0f}",
          flush=True)

children = []
for kind, rate in (("small", 10000), ("big", 200), ("series", 100)):
    pid = os.fork()
    if pid == 0:
        flood(kind, rate)
        os._exit(0)
    children.append(pid)
print("ready", flush=True)
for pid in children:
    os.waitpid(pid, 0)
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def client_dir() -> Iterator[Path]:
    """The client and prometheus-client, copied where every job's user can read them."""
    base = Path(tempfile.mkdtemp(prefix="sge-training-client-", dir="/var/tmp"))
    try:
        package = base / "slurm_gpu_exporter"
        package.mkdir()
        source = Path(slurm_gpu_exporter.__file__).parent
        for name in ("__init__.py", "training.py"):
            shutil.copy(source / name, package / name)
        shutil.copytree(Path(prometheus_client.__file__).parent, base / "prometheus_client",
                        ignore=shutil.ignore_patterns("__pycache__"))
        (base / "train.py").write_text(TRAIN_PY)
        (base / "flood.py").write_text(FLOOD_PY)
        for path in [base, *base.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _script(cluster: SlurmCluster, client: Path, program: str, *args: object) -> str:
    return (f"#!/bin/sh\nexport SLURM_GPU_EXPORTER_SPOOL_DIR={cluster.spool_dir}\n"
            f"export PYTHONPATH={client}\n"
            f"exec python3 {client / program} {' '.join(map(str, args))}\n")


@contextlib.contextmanager
def job(cluster: SlurmCluster, script: str, user: str) -> Iterator[int]:
    """A one-GPU job, running and past its "ready" line; cancelled at the end."""
    jobid = cluster.submit(script, user=user, gres="gpu:1")
    try:
        cluster.wait_state(jobid, "RUNNING", timeout=30)
        cluster.wait_output(jobid, "ready\n", timeout=30)
        yield jobid
    finally:
        cluster.cancel(jobid)
        with contextlib.suppress(SlurmError):
            cluster.wait_finished(jobid, timeout=30)


def training_series(s: Scrape, name: str) -> dict[tuple[str, str], float]:
    """{(jobid, user): value} of one training metric (no labels of the script's own)."""
    return {(labels["jobid"], labels["user"]): v for labels, v in series(s.text, name)}


def training_errors(s: Scrape) -> float:
    return s.value("slurm_gpu_exporter_sample_errors_total", source="training") or 0.0


def mentions_training_of(s: Scrape, jobid: int) -> bool:
    return any(line.startswith("slurm_job_training_") and f'jobid="{jobid}"' in line
               for line in s.text.splitlines())


def rss_bytes(agent: Agent) -> int:
    for line in Path(f"/proc/{agent.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slurm
def test_jobs_publish_under_their_own_jobid_and_user_outsiders_are_refused_and_series_go(
        slurm_cluster: SlurmCluster, client_dir: Path, tmp_path: Path) -> None:
    cluster = slurm_cluster
    with running_agent(cluster, tmp_path) as agent:
        assert scrape(agent).value("slurm_gpu_exporter_source_up", source="training") == 1
        # Job b's script claims job a's jobid in its labels.
        with job(cluster, _script(cluster, client_dir, "train.py", 7, "forged", 120),
                 "sgeuser") as a, \
                job(cluster, _script(cluster, client_dir, "train.py", 8, a, 120),
                    "sgeuser2") as b:
            both = wait_scrape(agent, "both jobs' training series",
                               lambda s: len(training_series(s, DEMO)) == 2, timeout=30)
            assert training_series(both, DEMO) == {
                (str(a), "sgeuser"): 7.0, (str(b), "sgeuser2"): 8.0}
            steps = training_series(both, STEPS)[(str(a), "sgeuser")]
            wait_scrape(agent, "job a's steps rising",
                        lambda s: training_series(s, STEPS).get((str(a), "sgeuser"), 0)
                        > steps, timeout=10)
            assert training_errors(both) == 0

            # A process outside every job (this test, as root) is refused and counted.
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as outsider:
                outsider.connect(str(cluster.spool_dir / "training.sock"))
                with contextlib.suppress(OSError):
                    outsider.send(b"demo_value 9\n")
                refused = wait_scrape(agent, "the outsider counted",
                                      lambda s: training_errors(s) >= 1, timeout=10)
            assert 9.0 not in training_series(refused, DEMO).values()

            cluster.cancel(a)
            ended = wait_scrape(
                agent, "job a ended",
                lambda s: s.job("slurm_job_end_time_seconds", a) is not None, timeout=15)
            end = ended.job("slurm_job_end_time_seconds", a)
            assert end is not None
            # While it lingers its last values stay.
            assert training_series(ended, DEMO)[(str(a), "sgeuser")] == 7.0
            gone = wait_scrape(agent, "job a's training series gone",
                               lambda s: not mentions_training_of(s, a),
                               timeout=LINGER + 10)
            assert gone.at - end >= LINGER - 0.1, "the series did not linger"
            assert training_series(gone, DEMO) == {(str(b), "sgeuser2"): 8.0}


@pytest.mark.slurm
def test_a_flood_from_one_job_leaves_metrics_serving_and_another_jobs_series_intact(
        slurm_cluster: SlurmCluster, client_dir: Path, tmp_path: Path) -> None:
    cluster = slurm_cluster
    with running_agent(cluster, tmp_path) as agent, \
            job(cluster, _script(cluster, client_dir, "train.py", 5, "x", 120),
                "sgeuser") as good:
        key = (str(good), "sgeuser")
        wait_scrape(agent, "the good job's series",
                    lambda s: key in training_series(s, STEPS), timeout=30)
        baseline = [_timed_scrape(agent)[1] for _ in range(20)]
        rss_before = rss_bytes(agent)
        errors_before = training_errors(scrape(agent))
        steps_before = training_series(scrape(agent), STEPS)[key]

        with job(cluster, _script(cluster, client_dir, "flood.py", 10), "sgeuser2") as bad:
            during: list[float] = []
            rss_peak = rss_before
            deadline = time.monotonic() + 60
            while "done" not in cluster.output(bad) and time.monotonic() < deadline:
                _, seconds = _timed_scrape(agent)
                during.append(seconds)
                rss_peak = max(rss_peak, rss_bytes(agent))
                time.sleep(0.05)
            flood_out = cluster.output(bad)
            assert "done" in flood_out, flood_out
            after = wait_scrape(agent, "the flood refused and counted",
                                lambda s: training_errors(s) > errors_before, timeout=30)
            # The good job's pushes still land.
            later = wait_scrape(agent, "the good job's steps rising after the flood",
                                lambda s: training_series(s, STEPS).get(key, 0)
                                > steps_before, timeout=30)
            assert training_series(later, DEMO)[key] == 5.0
            flooder = [line for line in later.text.splitlines()
                       if line.startswith("slurm_job_training_") and f'jobid="{bad}"' in line]
            # Some of the flood got through, never more than the per-job series limit.
            assert 1 <= len(flooder) <= 200, flooder
            rss_peak = max(rss_peak, rss_bytes(agent))

        report = {
            "scrape_ms_p50_before": 1000 * statistics.median(baseline),
            "scrape_ms_max_before": 1000 * max(baseline),
            "scrape_ms_p50_during": 1000 * statistics.median(during),
            "scrape_ms_max_during": 1000 * max(during),
            "scrapes_during": len(during),
            "rss_mib_before": rss_before / MiB,
            "rss_mib_peak": rss_peak / MiB,
            "training_errors_counted": training_errors(after) - errors_before,
            "flooder_series_held": len(flooder),
        }
        print("training flood:", report, flood_out.replace("\n", "; "))
        # Generous: the agent's budget is 60 MB; a flood must not grow it without bound.
        assert rss_peak < 150 * MiB, report


def _timed_scrape(agent: Agent) -> tuple[Scrape, float]:
    t0 = time.perf_counter()
    s = scrape(agent)
    return s, time.perf_counter() - t0


@pytest.mark.process
def test_client_copy_imports_nothing_but_the_standard_library_and_prometheus_client(
        client_dir: Path) -> None:
    """The job side of these tests runs the client from the copy alone."""
    env = {"PYTHONPATH": str(client_dir), "PATH": os.environ.get("PATH", "")}
    out = subprocess.run([sys.executable, "-S", "-c",
                          "import slurm_gpu_exporter.training as t; print(t.socket_path())"],
                         env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
