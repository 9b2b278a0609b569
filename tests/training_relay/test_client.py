"""The client never blocks or raises into the training loop, and leaves no thread behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from slurm_gpu_exporter import training
from slurm_gpu_exporter.training_relay import TrainingRelay
from tests.support import REPO, wait_until
from tests.training_relay.conftest import series_of

THREAD = "slurm-gpu-exporter-training"
ALICE = (("jobid", "101"), ("user", "alice"))
# Generous: only a loop that waited on the agent would take this long for one step.
HANG = 1.0


def _healthy(report: dict) -> None:
    assert report["errors"] == 0
    assert report["slowest_step_s"] < HANG
    assert THREAD not in report["threads"]


@pytest.mark.process
def test_client_imports_without_the_agents_dependencies():
    blocked = ["aiohttp", "psutil", "pynvml", "yaml", "bcrypt"]
    code = f"""
import sys
import threading
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
from slurm_gpu_exporter import training
training.step(1, samples=2, loss=0.5, lr=0.1)
training.gauge('x', 1)
print(sorted(m for m in sys.modules if m.startswith('slurm_gpu_exporter')))
"""
    env = {**os.environ, "SLURM_GPU_EXPORTER_SPOOL_DIR": "/nonexistent"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True,
                         capture_output=True, text=True, timeout=30)
    assert out.stderr == ""
    assert out.stdout.strip() == "['slurm_gpu_exporter', 'slurm_gpu_exporter.training']"


def test_agent_absent_client_drops_and_exits_cleanly(spool, senders):
    report = senders("client", "1", "0.5").go().finish()  # nothing listens in spool
    _healthy(report)
    assert report["sent"] == 0
    assert report["dropped"] > 0


@pytest.mark.parametrize("accepts", [False, True], ids=["never-accepts", "accepts-never-reads"])
def test_hung_agent_does_not_slow_or_hold_the_client(spool, senders, accepts):
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    hung.bind(os.path.join(spool, "training.sock"))
    hung.listen(1)
    held = []
    try:
        # Long enough for the pushes to fill the socket buffer.
        sender = senders("client", "1", "4").go()
        if accepts:
            conn, _ = hung.accept()
            held.append(conn)
        report = sender.finish(timeout=20)
    finally:
        for conn in held:
            conn.close()
        hung.close()
    _healthy(report)
    assert report["sent"] > 0  # until the socket buffer filled
    assert report["dropped"] > 0  # then dropped, never waited


def test_agent_vanishing_mid_run_then_returning(spool, jobs, senders):
    sender = senders("client", "4", "4")
    jobs.by_pid[sender.pid] = ("101", "alice")
    first = TrainingRelay(spool, jobs)
    first.start()
    sender.go()
    try:
        wait_until(lambda: series_of(first, "slurm_job_training_demo_value"))
    finally:
        first.stop()
    second = TrainingRelay(spool, jobs)
    second.start()  # the agent restarted: the client reconnects by itself
    try:
        wait_until(lambda: series_of(second, "slurm_job_training_demo_value") == {ALICE: 4.0})
        report = sender.finish()
    finally:
        second.stop()
    _healthy(report)
    assert report["dropped"] > 0


def test_a_forked_child_publishes_on_its_own_connection(relay, jobs, senders):
    sender = senders("fork")
    jobs.by_pid[sender.pid] = ("101", "alice")
    # The child's pid is known only once it runs: put any child of the sender in job 202.
    parent_of = _parent_pid
    jobs.fallback = lambda pid: ("202", "bob") if parent_of(pid) == sender.pid else None
    sender.go()
    wait_until(lambda: len(series_of(relay, "slurm_job_training_steps_total")) == 2)
    sender.go()  # the child may end now
    report = sender.finish()
    assert THREAD not in report["threads"]
    assert series_of(relay, "slurm_job_training_steps_total") == {
        ALICE: 1.0, (("jobid", "202"), ("user", "bob")): 5.0}


def test_counts_go_on_after_close(relay, jobs, senders):
    sender = senders("restart")
    jobs.by_pid[sender.pid] = ("101", "alice")
    sender.go()
    wait_until(lambda: series_of(relay, "slurm_job_training_steps_total") == {ALICE: 5.0})
    report = sender.finish()
    assert THREAD not in report["threads"]


def test_registry_over_the_message_limit_is_dropped_with_one_warning(relay, jobs, senders):
    sender = senders("too-big")
    jobs.by_pid[sender.pid] = ("101", "alice")
    warning = ("training metrics not sent: 90845 bytes, 3002 lines is over the agent's "
               "limit of 65536 bytes, 2000 lines; relay fewer series\n")
    report = sender.go().finish(stderr=warning)
    assert report["dropped"] >= 3  # every push, one warning
    assert relay.error_counts()["size"] == 0  # never sent


def _parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def test_bad_values_never_raise_into_the_loop(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_GPU_EXPORTER_SPOOL_DIR", str(tmp_path))
    try:
        training.step("many")  # type: ignore[arg-type]
        training.step(1, loss=object())  # type: ignore[arg-type]
        training.gauge("bad name!", "not a number")  # type: ignore[arg-type]
        training.relay(object())  # type: ignore[arg-type]
        training.step(2, samples=3)
        assert training.socket_path() == str(tmp_path / "training.sock")
    finally:
        training.close()
    assert THREAD not in {t.name for t in threading.enumerate()}


def test_nothing_starts_after_the_exit_hook(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_GPU_EXPORTER_SPOOL_DIR", str(tmp_path))
    monkeypatch.setattr(training, "_exiting", True)
    training.step(1)
    training.relay()
    assert THREAD not in {t.name for t in threading.enumerate()}
