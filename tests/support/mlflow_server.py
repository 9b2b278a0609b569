"""A real MLflow tracking server for the tests, from ``.venv-mlflow`` (MLflow in a venv
of its own: the package never depends on it). The venv is made by
``scripts/setup-mlflow-venv`` (scripts/test runs it) or, where it is missing, here;
failing to make it skips the test, and fails it under CI=true."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from tests.support import free_port, require, wait_until
from tests.support.daemons import REPO, Daemon

VENV = Path(os.environ.get("SGE_MLFLOW_VENV") or REPO / ".venv-mlflow")
SETUP = REPO / "scripts" / "setup-mlflow-venv"
# Measured: the server answers about 11-17 s after start on a loaded 2-core machine.
START_TIMEOUT_S = 120


def mlflow_python() -> Path:
    """The venv's python, the venv made first where it is missing (one maker at a time)."""
    python = VENV / "bin" / "python"
    with open(os.path.join(tempfile.gettempdir(), "sge-mlflow-venv.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (VENV / ".installed").exists():
            made = subprocess.run([str(SETUP)], capture_output=True, text=True, timeout=900,
                                  check=False, env={**os.environ, "SGE_MLFLOW_VENV": str(VENV)})
            require(made.returncode == 0,
                    f"cannot make {VENV} with {SETUP}: {made.stderr.strip()[-500:]}")
    return python


ADMIN = ("admin", "admin-pass-Secret-1")


class MlflowServer(Daemon):
    """``mlflow server`` on 127.0.0.1 over a SQLite store in ``workdir``; with
    ``basic_auth``, MLflow's basic-auth app (``--app-name basic-auth``), its admin
    ``ADMIN``, every other user READ by default; ``api`` then signs in as ``as_user``
    (the admin unless told)."""

    def __init__(self, workdir: Path, basic_auth: bool = False) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        python = mlflow_python()
        port = free_port()
        argv = [str(python.parent / "mlflow"), "server",
                "--backend-store-uri", f"sqlite:///{workdir / 'mlflow.sqlite'}",
                "--default-artifact-root", str(workdir / "artifacts"),
                "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
        self.admin: tuple[str, str] | None = None
        if basic_auth:
            ini = workdir / "basic_auth.ini"
            ini.write_text("[mlflow]\ndefault_permission = READ\n"
                           f"database_uri = sqlite:///{workdir / 'basic_auth.sqlite'}\n"
                           f"admin_username = {ADMIN[0]}\nadmin_password = {ADMIN[1]}\n"
                           "authorization_function = "
                           "mlflow.server.auth:authenticate_request_basic_auth\n")
            # Daemon starts argv with this process's environment: env(1) adds the path.
            argv = ["env", f"MLFLOW_AUTH_CONFIG_PATH={ini}",
                    f"MLFLOW_FLASK_SERVER_SECRET_KEY={os.urandom(16).hex()}", *argv,
                    "--app-name", "basic-auth"]
            self.admin = ADMIN
        super().__init__("mlflow", argv, port, workdir)
        self.python = python

    def wait_ready(self, path: str = "/health", timeout: float = START_TIMEOUT_S) -> None:
        """Until /health answers; a slow answer while the server starts is not ready yet
        (on a loaded machine it accepts connections well before it answers them)."""
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + path, timeout=5) as resp:
                    return resp.status == 200
            except OSError:  # refused, reset, timed out (URLError is an OSError too)
                return False

        wait_until(ready, timeout, "mlflow server to answer", poll=0.5, log=self.log)

    def api(self, method: str, body: dict[str, Any] | None = None,
            as_user: tuple[str, str] | None = None, version: str = "2.0") -> dict[str, Any]:
        """One REST call (POST with a body, else GET); its JSON answer. Signed in as
        ``as_user`` (user, password), else as the admin where the server has auth."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        who = as_user or self.admin
        if who is not None:
            pair = base64.b64encode(f"{who[0]}:{who[1]}".encode()).decode()
            headers["Authorization"] = f"Basic {pair}"
        request = urllib.request.Request(f"{self.url}/api/{version}/mlflow/{method}",
                                         data=data, headers=headers)
        with urllib.request.urlopen(request, timeout=30) as resp:
            return json.loads(resp.read() or b"{}")

    def create_user(self, user: str, password: str) -> None:
        """A user of the basic-auth app (made by the admin through the auth API)."""
        self.api("users/create", {"username": user, "password": password})

    def grant(self, user: str, experiment_id: str, permission: str = "EDIT") -> None:
        """``permission`` on one experiment to ``user`` (the auth API, as the admin)."""
        self.api("users/permissions/grant", {
            "username": user, "resource_type": "experiment", "resource_id": experiment_id,
            "permission": permission}, version="3.0")

    def run(self, run_id: str) -> dict[str, Any]:
        """A run's info, its tags as a dict, and its metrics' full history by key."""
        run = self.api(f"runs/get?run_id={run_id}")["run"]
        tags = {t["key"]: t["value"] for t in run["data"].get("tags", [])}
        history = {m["key"]: self.api(f"metrics/get-history?run_id={run_id}&metric_key="
                                      f"{urllib.request.quote(m['key'])}")["metrics"]
                   for m in run["data"].get("metrics", [])}
        return {"info": run["info"], "tags": tags, "history": history}
