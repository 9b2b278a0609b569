"""``enforce --cancel`` under faults, on real parts: a real Slurm job, the agent over the
fake NVML, a real Prometheus scraping it every second. The job is idle and due for its
cancel (a dry run says so right before each fault); then one thing breaks and the run
that should have cancelled it must cancel nothing and say why in its exit code:

- a partial answer (``warnings``, as Thanos gives with a store down): exit 4;
- a query that times out: exit 3;
- the job's node has no series of it (the scrape target labels another node): exit 7;
- ``scancel`` failing: exit 8;
- Prometheus killed in the middle of the run's queries: exit 3;
- the job requeued between the run's ``squeue`` and its cancel: exit 7.

A proxy in front of Prometheus makes the partial answer, the slow answer and the kill;
stand-ins first on PATH make ``scancel`` fail and requeue the job (for real, with
``scontrol requeue``) right before enforce's last look at it.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.fakenvml import Process
from tests.support import free_port, wait_until
from tests.support.rig import Rig, Scrape
from tests.support.slurmcluster import SlurmCluster

pytestmark = [pytest.mark.process, pytest.mark.slurm, pytest.mark.fakenvml,
              pytest.mark.prometheus]

REPORT = Path(sys.executable).parent / "slurm-gpu-report"
# The window is 20 s, not less: its counters must cover 80 % of it, and with a 1 s
# scrape of a 1 s sample the first and last samples in it span 1 to 2 s less than the
# window (an 8 s window read 6.0 to 7.9 s, and 6.4 was needed: a coin toss per run).
POLICY = """
[idle]
warn_after = []
cancel_after = "20s"
min_job_age = "4s"
max_cancels_per_run = 1
"""


class PrometheusProxy:
    """Forwards the Prometheus API to the rig's Prometheus; ``mode`` breaks it on purpose:
    ``warnings`` adds a warning to every answer, ``slow`` answers after 4 s, ``kill``
    kills Prometheus at the run's third query (that one and the rest get no answer)."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.mode = "pass"
        self.queries = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                answer = proxy.answer(self.path, body)
                if answer is None:
                    self.close_connection = True
                    return
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # enforce gave up first (the slow answer): what is meant

            def log_message(self, *args: object) -> None:
                pass

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def answer(self, path: str, body: bytes) -> bytes | None:
        self.queries += 1
        if self.mode == "slow":
            time.sleep(4)
        if self.mode == "kill" and self.queries >= 3:
            self.rig.prom.proc.kill()
            return None
        request = urllib.request.Request(self.rig.prom.url + path, data=body, method="POST",
                                         headers={"Content-Type":
                                                  "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                data = json.load(resp)
        except (urllib.error.URLError, ConnectionError):
            return None
        if self.mode == "warnings":
            data["warnings"] = ["store gpu-b.example.org:10901 did not answer"]
        return json.dumps(data).encode()

    def stop(self) -> None:
        self._server.shutdown()


@dataclass
class Run:
    label: str
    rc: int
    stdout: str
    stderr: str

    def decision(self, jobid: str) -> dict[str, Any]:
        found = {d["jobid"]: d for d in json.loads(self.stdout)["decisions"]}
        return found.get(jobid, {})


@dataclass
class Faults:
    cluster: SlurmCluster
    jobid: str
    runs: dict[str, Run] = field(default_factory=dict)
    states: dict[str, str | None] = field(default_factory=dict)  # after each fault run
    state_file: Path = Path()


def _stand_in(bindir: Path, name: str, script: str) -> None:
    path = bindir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture(scope="module")
def faults(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Faults]:
    began = time.monotonic()
    base = tmp_path_factory.mktemp("enforce-faults")
    policy = base / "policy.toml"
    policy.write_text(POLICY)
    squeue, scancel = shutil.which("squeue"), shutil.which("scancel")
    assert squeue and scancel
    requeuing, failing = base / "bin-requeue", base / "bin-scancel-fails"
    requeuing.mkdir()
    failing.mkdir()
    count = base / "squeue-calls"
    # The run's second squeue is its look right before the cancel: requeue first.
    _stand_in(requeuing, "squeue",
              f'echo x >> {count}\nif [ "$(wc -l < {count})" -eq 2 ]; then\n'
              f'  scontrol requeue "$SGE_FAULT_JOBID"\nfi\nexec {squeue} "$@"\n')
    _stand_in(failing, "scancel",
              'echo "scancel: error: Kill job error on job id $1: Access/permission denied"'
              ' >&2\nexit 1\n')
    started: list[Any] = []
    jobid = None
    try:
        rig = Rig(base, cluster=slurm_cluster, scrape=Scrape(
            "slurm-gpu-exporter", {"node": slurm_cluster.node_name, "decoy": "gpu-elsewhere"},
            timeout="1s"))
        started.append(rig)
        proxy = PrometheusProxy(rig)
        started.append(proxy)
        jobid = str(slurm_cluster.submit("sleep 600\n", gres="gpu:1",
                                         extra_args=["--job-name=idle-faults"]))
        slurm_cluster.wait_state(int(jobid), "RUNNING", timeout=30)
        pid = min(slurm_cluster.wait_for_process(int(jobid), "batch"))
        record = wait_until(lambda: slurm_cluster.gpu_record(jobid), 15, "the spool record")
        rig.devices[int(record["job_gpus"])].processes = [Process(pid, 1 << 30)]
        rig.write_nvml()
        found = Faults(slurm_cluster, jobid, state_file=base / "enforce.json")

        def enforce(label: str, *extra: str, cancel: bool = True, path: Path | None = None,
                    node_label: str = "node", timeout: str = "2") -> Run:
            argv = [str(REPORT), "enforce", "--policy", str(policy), "--format", "json",
                    "--prometheus-url", proxy.url, "--timeout", timeout, "--node-label",
                    node_label, "--state-file", str(found.state_file), *extra]
            if cancel:
                argv.append("--cancel")
            env = {**os.environ, **slurm_cluster.env, "SGE_FAULT_JOBID": jobid}
            if path is not None:
                env["PATH"] = f"{path}:{env['PATH']}"
            proxy.queries = 0
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=90, env=env,
                                  check=False)
            return Run(label, proc.returncode, proc.stdout, proc.stderr)

        def due() -> bool:
            run = enforce("dry", cancel=False)
            return run.stdout.startswith("{") and run.decision(jobid).get("action") == "cancel"

        def fault(label: str, mode: str = "pass", **kw: Any) -> None:
            proxy.mode = "pass"
            wait_until(due, 60, f"the job to be due for its cancel before {label}", poll=1)
            proxy.mode = mode
            found.runs[label] = enforce(label, **kw)
            proxy.mode = "pass"
            found.states[label] = slurm_cluster.state(int(jobid))

        fault("partial answer", "warnings")
        fault("query timeout", "slow")
        fault("node without series", node_label="decoy")
        fault("scancel fails", path=failing)
        fault("prometheus killed", "kill")
        # Started again on its data (as systemd would): the job is due again.
        rig.restart_prometheus()
        # Last: Slurm holds a requeued job back for a while (BeginTime).
        # Up to three tries: after the restart a run can still find the job's counters
        # short of the window (doubtful, exit 7, nothing cancelled) and then never
        # reaches its look before the cancel; such a run requeues nothing (the stand-in
        # requeues at the run's second squeue), so the next try starts as the first.
        for _ in range(3):
            count.unlink(missing_ok=True)
            fault("requeued before the cancel", path=requeuing)
            if "no longer runs it" in found.runs["requeued before the cancel"].stderr:
                break
        print(f"enforce faults: {time.monotonic() - began:.1f} s")
        yield found
    finally:
        if jobid is not None:
            slurm_cluster.cancel(jobid)
        for thing in reversed(started):
            thing.stop()


@pytest.mark.parametrize(("label", "code", "words"), [
    ("partial answer", 4, "partial data"),
    ("query timeout", 3, "did not answer within"),
    ("node without series", 7, "cannot be trusted"),
    ("scancel fails", 8, "Access/permission denied"),
    ("requeued before the cancel", 7, "no longer runs it as this run saw it"),
    ("prometheus killed", 3, "Prometheus"),
])
def test_a_fault_cancels_nothing_and_the_exit_code_says_why(
        faults: Faults, label: str, code: int, words: str) -> None:
    run = faults.runs[label]
    assert run.rc == code, f"{label}: rc {run.rc}\n{run.stdout[-2000:]}\n{run.stderr}"
    assert words in run.stderr, run.stderr + run.stdout
    assert faults.states[label] != "CANCELLED", label
    state = json.loads(faults.state_file.read_text()) if faults.state_file.exists() else {}
    assert "cancelled" not in state.get("jobs", {}).get(faults.jobid, {})


def test_the_node_without_series_is_named_in_the_decision(faults: Faults) -> None:
    decision = faults.runs["node without series"].decision(faults.jobid)
    assert decision["action"] == "skip" and decision["doubtful"]
    assert f"Slurm runs it on {faults.cluster.node_name} too" in decision["reason"]
