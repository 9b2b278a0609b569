"""Real Prometheus, Alertmanager and a webhook receiver for the tests (deploy/, report).

Each runs on 127.0.0.1 on a free port with its own temporary storage, and is ended by
its own PID.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from tests.support import REPO, free_port, require, wait_until

DEPLOY = REPO / "deploy"


def tool(*names: str, package: str) -> str:
    """The path of the first of ``names`` on PATH; skip (fail under CI) when none is."""
    found = next((p for p in map(shutil.which, names) if p), None)
    require(found is not None, f"{names[0]} (Debian package {package}) is not installed")
    assert found is not None
    return found


def http_json(url: str, data: dict[str, str] | None = None, timeout: float = 10) -> Any:
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    try:
        with urllib.request.urlopen(url, data=body, timeout=timeout) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as exc:
        return json.load(exc)


def end_process(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """End a child this test started, by its PID: SIGTERM, then SIGKILL after 15 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class Daemon:
    """A server process with a log file; ``url`` is its base URL."""

    def __init__(self, name: str, argv: list[str], port: int, workdir: Path) -> None:
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = workdir / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     cwd=workdir)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def wait_ready(self, path: str = "/-/ready", timeout: float = 30) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n"
                                   f"{self.log()}")
            try:
                with urllib.request.urlopen(self.url + path, timeout=2) as resp:
                    return resp.status == 200
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_until(ready, timeout, f"{self.name} to be ready", poll=0.2, log=self.log)

    def stop(self) -> None:
        end_process(self.proc)
        self._log.close()


class Prometheus(Daemon):
    """Debian's prometheus with a config written from a dict, or on a config file as is."""

    def __init__(self, name: str, config: dict | Path, workdir: Path,
                 extra_args: tuple[str, ...] = ()) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        if isinstance(config, Path):
            config_path = config
        else:
            config_path = workdir / "prometheus.yml"
            config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        binary = tool("prometheus", package="prometheus")
        super().__init__(name, [
            binary, f"--config.file={config_path}", f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", *extra_args,
        ], port, workdir)

    def query(self, expr: str, at: float | None = None) -> dict:
        """The raw API answer to an instant query (status, data or error)."""
        args = {"query": expr}
        if at is not None:
            args["time"] = f"{at:.3f}"
        return http_json(self.url + "/api/v1/query", args)

    def query_range(self, expr: str, start: float, end: float, step: float = 1) -> dict:
        return http_json(self.url + "/api/v1/query_range", {
            "query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": str(step)})

    def vector(self, expr: str, at: float | None = None) -> list[dict]:
        answer = self.query(expr, at)
        assert answer["status"] == "success", (expr, answer)
        return answer["data"]["result"]

    def label_values(self, label: str, match: str) -> list[str]:
        url = (f"{self.url}/api/v1/label/{urllib.parse.quote(label)}/values?"
               + urllib.parse.urlencode({"match[]": match}))
        answer = http_json(url)
        assert answer["status"] == "success", (label, match, answer)
        return answer["data"]

    def wait_for(self, expr: str, timeout: float = 60, min_results: int = 1) -> list[dict]:
        """Poll an instant query until it returns at least ``min_results`` series."""
        last: list[dict] = []

        def enough() -> list[dict] | None:
            nonlocal last
            last = self.vector(expr)
            return last if len(last) >= min_results else None

        return wait_until(enough, timeout, f"{self.name}: {expr} (last answer: {last})",
                          poll=0.5, log=self.log)


class Alertmanager(Daemon):
    def __init__(self, config: dict, workdir: Path, extra_args: tuple[str, ...] = ()) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        config_path = workdir / "alertmanager.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        binary = tool("prometheus-alertmanager", "alertmanager",
                      package="prometheus-alertmanager")
        super().__init__("alertmanager", [
            binary, f"--config.file={config_path}", f"--storage.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
            "--log.level=warn", *extra_args,
        ], port, workdir)


class WebhookReceiver:
    """An HTTP server that records every Alertmanager notification it gets, by path."""

    def __init__(self) -> None:
        self.notifications: list[tuple[str, dict]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                payload = json.loads(self.rfile.read(length) or b"{}")
                with receiver._lock:
                    receiver.notifications.append((self.path, payload))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def alerts(self) -> list[tuple[str, dict]]:
        """(receiver path, alert) for every alert in every notification so far."""
        with self._lock:
            return [(path, alert) for path, payload in self.notifications
                    for alert in payload.get("alerts", [])]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
