"""Fixtures for the training relay tests: a relay on a real unix socket, real senders."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurm_gpu_exporter.training_relay import RelayLimits, TrainingRelay
from tests.support import REPO

SENDER = Path(__file__).resolve().parent / "sender.py"


class Jobs:
    """job_of_pid for the tests: the pids the test put in a job, else None."""

    def __init__(self) -> None:
        self.by_pid: dict[int, tuple[str, str]] = {}
        self.asked: list[int] = []
        self.fallback: Callable[[int], tuple[str, str] | None] = lambda pid: None

    def __call__(self, pid: int) -> tuple[str, str] | None:
        self.asked.append(pid)
        return self.by_pid.get(pid) or self.fallback(pid)


class Sender:
    """A sender.py process; it waits for go() so its pid can be put in a job first."""

    def __init__(self, spool: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SENDER), *args], cwd=REPO, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "SLURM_GPU_EXPORTER_SPOOL_DIR": spool})
        self.pid = self.proc.pid

    def go(self) -> Sender:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self

    def finish(self, timeout: float = 30.0, stderr: str = "") -> dict:
        """Wait for the exit; its report. Its stderr must be ``stderr`` exactly."""
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err
        assert err == stderr, err  # the client never prints a traceback
        return json.loads(out.strip().splitlines()[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def spool() -> Iterator[str]:
    # A short path: a unix socket path holds at most 107 bytes.
    path = tempfile.mkdtemp(prefix="sge-training-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def jobs() -> Jobs:
    return Jobs()


@pytest.fixture
def limits() -> RelayLimits:
    # The test clients push every 0.05 s, 20 times the default rate's worth.
    return RelayLimits(messages_per_second=200, message_burst=200, lines_per_second=10_000)


@pytest.fixture
def relay(spool: str, jobs: Jobs, limits: RelayLimits) -> Iterator[TrainingRelay]:
    server = TrainingRelay(spool, jobs, limits=limits)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def senders(spool: str) -> Iterator[Callable[..., Sender]]:
    started: list[Sender] = []

    def start(*args: str) -> Sender:
        sender = Sender(spool, *args)
        started.append(sender)
        return sender

    yield start
    for sender in started:
        sender.kill()


def values(server: TrainingRelay) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The relay's series as {(sample name, sorted labels): value}."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in server.families() for s in f.samples}


def series_of(server: TrainingRelay, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples named ``name``: {sorted labels: value}."""
    return {labels: v for (n, labels), v in values(server).items() if n == name}
