"""scripts/demo as a new user runs it."""

from __future__ import annotations

import errno
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support import REPO, free_port, require, wait_until

pytestmark = pytest.mark.process

ROOT = REPO
DEMO_PORT = 9817


@contextmanager
def _busy(port: int) -> Iterator[None]:
    """Keep 127.0.0.1:port taken (if something else already holds it, it is busy anyway)."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen()
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
    try:
        yield
    finally:
        sock.close()


def test_demo_moves_to_the_given_address_when_the_default_port_is_busy(
        tmp_path: Path) -> None:
    require((ROOT / ".venv" / "bin" / "slurm-gpu-exporter").exists(),
            "the repository's .venv is not set up (scripts/setup-venv)")
    port = free_port()
    log = tmp_path / "demo.log"
    with _busy(DEMO_PORT), log.open("wb") as out:
        proc = subprocess.Popen([str(ROOT / "scripts" / "demo"), "--web.listen-address",
                                 f"127.0.0.1:{port}", "--sample-interval", "1"],
                                stdout=out, stderr=subprocess.STDOUT)
        try:
            def answered() -> int | None:
                if proc.poll() is not None:
                    return -1  # it exited: the assert below shows its log
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready",
                                                timeout=2) as resp:
                        return resp.status
                except (urllib.error.URLError, ConnectionError):
                    return None

            status = wait_until(answered, 60, "the demo to answer /-/ready", poll=0.2,
                                log=log.read_text)
            assert status == 200, log.read_text()
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0, log.read_text()
    text = log.read_text()
    assert f"listening on http://127.0.0.1:{port}/metrics" in text
    assert f":{DEMO_PORT}/" not in text
