"""The relay against abuse by users on the node: one user's many connections, type
clashes between relayed names, and connection churn from outside every job."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from slurm_gpu_exporter.node.cgroup import CgroupFS
from slurm_gpu_exporter.training_relay import RelayLimits, TrainingRelay
from slurm_gpu_exporter.training_relay.series import JobIdentity
from slurm_gpu_exporter.training_relay.source import RelayJobs
from slurm_gpu_exporter.training_relay.store import TrainingStore
from tests.support import require, wait_until
from tests.training_relay.conftest import Jobs

pytestmark = [pytest.mark.process]

NOBODY = 65534
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"

# Connects to the socket in argv[1] and holds the connection until stdin closes.
HOLD = """import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])
print("connected", flush=True)
sys.stdin.read()
"""
# Connects and hangs up as fast as it can for argv[2] seconds; prints how many times.
CHURN = """import socket, sys, time
end, n = time.monotonic() + float(sys.argv[2]), 0
while time.monotonic() < end:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(sys.argv[1])
        n += 1
    except OSError:
        time.sleep(0.0005)
    s.close()
print(n, flush=True)
"""


def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(path)
    return sock


def test_one_user_with_many_jobs_leaves_room_for_another_users_job(
        spool: str, jobs: Jobs) -> None:
    require(os.geteuid() == 0, "connecting as another user needs root")
    os.chmod(spool, 0o755)  # nobody must reach the socket
    limits = RelayLimits(max_connections=8, max_connections_per_job=8,
                         max_connections_per_user=4)
    relay = TrainingRelay(spool, jobs, limits=limits)
    relay.start()
    held: list[socket.socket] = []
    other = None
    try:
        jobs.fallback = lambda pid: ("7", "alice") if pid == os.getpid() else ("8", "bob")
        held = [_connect(relay.path) for _ in range(8)]  # alice's jobs: all the cap
        wait_until(lambda: relay.error_counts()["connections"] == 4, 5, "4 refused")
        other = subprocess.Popen([SYSTEM_PYTHON, "-c", HOLD, relay.path], text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 user=NOBODY, group=NOBODY)
        assert other.stdout is not None and other.stdout.readline() == "connected\n"
        wait_until(lambda: relay.connections() == 5, 5, "bob's connection taken in")
        assert relay.error_counts()["connections"] == 4  # bob was not refused
    finally:
        if other is not None:
            other.communicate("")
        for sock in held:
            sock.close()
        relay.stop()


def _exposition(store: TrainingStore) -> str:
    class Families(Collector):
        def collect(self):  # type: ignore[no-untyped-def]
            return store.families()

    registry = CollectorRegistry()
    registry.register(Families())
    return generate_latest(registry).decode()


@pytest.mark.parametrize(("first", "second"), [
    ("# TYPE x_total counter\nx_total 1\n", "# TYPE x_total gauge\nx_total 2\n"),
    ("# TYPE x_total gauge\nx_total 2\n", "# TYPE x_total counter\nx_total 1\n"),
    ("# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_count 1\nh_sum 2\n",
     "# TYPE h_count gauge\nh_count 5\n"),
    ("# TYPE s summary\ns_count 1\ns_sum 2\n", "# TYPE s_sum gauge\ns_sum 5\n"),
], ids=["gauge-after-counter", "counter-after-gauge", "histogram-count", "summary-sum"])
@pytest.mark.parametrize("same_job", [True, False], ids=["same-job", "other-job"])
def test_a_family_whose_names_clash_with_another_is_refused(
        first: str, second: str, same_job: bool) -> None:
    store = TrainingStore()
    store.ingest(JobIdentity("7", "alice"), first.encode())
    store.ingest(JobIdentity("7" if same_job else "8", "bob"), second.encode())
    assert store.error_counts()["type"] == 1
    text = _exposition(store)
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(types) == len(set(types)), text
    promtool = shutil.which("promtool")
    require(promtool is not None, "promtool (Debian's prometheus) is not installed")
    check = subprocess.run([str(promtool), "check", "metrics"], input=text, text=True,
                           capture_output=True, check=False)
    assert "error" not in (check.stdout + check.stderr).lower(), check.stdout + check.stderr


def _thread_cpu_seconds(native_id: int) -> float:
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_connection_churn_from_outside_every_job_costs_the_relay_little(spool: str) -> None:
    # The real job map: /proc and this node's cgroups, as the agent uses them.
    relay_jobs = RelayJobs(Path("/proc"), CgroupFS(Path("/sys/fs/cgroup")))
    relay = TrainingRelay(spool, relay_jobs.job_of_pid, job_of_key=relay_jobs.job_of_key)
    relay.start()
    try:
        thread = next(t for t in threading.enumerate() if t.name == "training-relay")
        assert thread.native_id is not None
        before, start = _thread_cpu_seconds(thread.native_id), time.monotonic()
        churn = subprocess.run([SYSTEM_PYTHON, "-c", CHURN, relay.path, "3"],
                               capture_output=True, text=True, check=True, timeout=30)
        wall = time.monotonic() - start
        busy = (_thread_cpu_seconds(thread.native_id) - before) / wall
        print(f"{churn.stdout.strip()} connects in {wall:.1f} s; relay thread "
              f"{busy:.0%} of a core; refused {relay.error_counts()['refused']}")
        assert busy < 0.25
    finally:
        relay.stop()
