"""A real Prometheus (Debian's) for the report tests: temp storage, 127.0.0.1, a free port."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tests.support import free_port


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


class Prometheus:
    """Started with a scrape config (or none, over existing storage); stopped by its PID."""

    def __init__(self, workdir: Path, targets: list[str] | None = None,
                 storage: Path | None = None, extra_args: list[str] | None = None) -> None:
        binary = prometheus_binary()
        assert binary is not None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "prometheus.log"
        config = workdir / "prometheus.yml"
        lines = ["global: {scrape_interval: 1s, evaluation_interval: 1s}"]
        if targets:
            quoted = ", ".join(f"'{t}'" for t in targets)
            lines += ["scrape_configs:", "  - job_name: slurm-gpu",
                      f"    static_configs: [{{targets: [{quoted}]}}]"]
        config.write_text("\n".join(lines) + "\n")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}",
             f"--storage.tsdb.path={storage or workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", *(extra_args or [])],
            stdout=subprocess.DEVNULL, stderr=self.log_path.open("wb"))

    def query(self, query: str, at: float | None = None) -> list[dict]:  # type: ignore[type-arg]
        params = {"query": query}
        if at is not None:
            params["time"] = f"{at:.3f}"
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.load(resp)["data"]["result"]  # type: ignore[no-any-return]

    def wait_for(self, query: str, timeout: float = 30.0) -> list[dict]:  # type: ignore[type-arg]
        """Poll until the query has a result; [] after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log()}")
            try:
                result = self.query(query)
                if result:
                    return result
            except OSError:
                pass
            time.sleep(0.25)
        return []

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
