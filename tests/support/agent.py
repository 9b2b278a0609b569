"""Start the real agent as a subprocess for tests, and end it by its PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.support import free_port, wait_until

BIN = Path(sys.executable).parent


class Agent:
    """A running slurm-gpu-exporter; ``url`` is its base URL on 127.0.0.1."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None,
                 log_path: Path | None = None, command: Sequence[str] | None = None) -> None:
        """Start the agent with ``args``; ``command`` runs it another way than this
        checkout's (a test cluster's ``site_command``: installed where its Slurm runs)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*(command or [str(BIN / "slurm-gpu-exporter")]),
             "--web.listen-address", f"127.0.0.1:{self.port}", *args],
            env={**os.environ, **(env or {})}, stdout=self._log, stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 20.0) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited with {self.proc.returncode}: {self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as resp:
                    return resp.status == 200
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_until(ready, timeout, "the agent to be ready", poll=0.1, log=self.log)

    def get(self, path: str = "/metrics", headers: dict[str, str] | None = None
            ) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def metrics(self) -> str:
        status, _, body = self.get()
        assert status == 200, body
        return body.decode()

    def wait_metrics(self, check: Callable[[str], bool], timeout: float = 15.0,
                     what: str = "condition") -> str:
        """Scrape until ``check(text)`` holds; returns that scrape."""
        last = [""]

        def scrape() -> str | None:
            last[0] = self.metrics()
            return last[0] if check(last[0]) else None

        return wait_until(scrape, timeout, what, poll=0.2,
                          log=lambda: f"agent log:\n{self.log()}\nlast scrape:\n{last[0]}")

    def log(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._log is not subprocess.DEVNULL:
            self._log.close()  # type: ignore[union-attr]
        return self.proc.returncode


def series(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of one metric in a text exposition: (labels, value) pairs."""
    from prometheus_client.parser import text_string_to_metric_families

    found = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found.append((dict(sample.labels), float(sample.value)))
    return found
