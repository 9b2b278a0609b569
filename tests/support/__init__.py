"""Helpers shared by the test suite."""

from __future__ import annotations

import base64
import json
import os
import random
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")

# The checkout's root and the captured node trees, wherever a test file sits under tests/.
REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require(condition: bool, reason: str) -> None:
    """Skip when a real component is missing; under CI=true that is a failure instead."""
    if condition:
        return
    if in_ci():
        pytest.fail(f"required for this test and missing under CI: {reason}")
    pytest.skip(reason)


def free_port() -> int:
    """A port free on 127.0.0.1 now, from below the kernel's ephemeral range: a port the
    kernel picks (bind to 0) is the kind it also hands to outgoing connections, which can
    take it before the test's daemon binds it ("Address already in use")."""
    for _ in range(200):
        port = random.SystemRandom().randrange(20000, 32768)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port found between 20000 and 32767 on 127.0.0.1")


def wait_until(
    probe: Callable[[], T],
    timeout: float = 10.0,
    what: str = "",
    *,
    poll: float = 0.05,
    log: Callable[[], str] = lambda: "",
) -> T:
    """Call ``probe`` until it returns something truthy, and return that.

    Fails the test after ``timeout`` seconds, naming ``what`` was awaited (the probe
    itself when not given) and adding ``log()`` (an agent's or daemon's log, say) to the
    message. The suite's one waiting loop: every test that waits calls this.
    """
    what = what or repr(probe)
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            detail = log()
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}"
                        + (f"\n{detail}" if detail else ""))
        time.sleep(poll)


def move_aside(path: Path) -> Path | None:
    """Move ``path`` (a file, directory or symlink) aside, next to itself: a rename, so
    nothing is copied. Returns where it went; None when there was nothing."""
    if not (path.exists() or path.is_symlink()):
        return None
    sibling = path.with_name(f".{path.name}.test-saved")
    os.rename(path, sibling)
    return sibling


class Clock:
    """A clock the test moves by hand: calling it gives ``now``; set or add to ``now``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def basic_auth(user: str, password: str) -> str:
    """An ``Authorization`` header's value for HTTP basic auth."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def job_figures(run: subprocess.CompletedProcess[str]) -> dict:
    """The one job of a successful ``slurm-gpu-report job --format json``."""
    assert run.returncode == 0, run.stderr
    (job,) = json.loads(run.stdout)["jobs"]
    return job
