"""slurm-gpu-mail as slurmctld runs it, with a stand-in report and mailer: the summary
is added; a report that hangs, fails or talks nonsense leaves Slurm's mail unchanged,
in bounded time."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_gpu_exporter.mail.cli import inert_arguments

pytestmark = pytest.mark.process

WRAPPER = str(Path(sys.executable).parent / "slurm-gpu-mail")
ARGS = ["-s", "Slurm Job_id=42 Name=x Ended, Run time 00:10:00, COMPLETED, ExitCode 0",
        "alice"]
ENV = {"SLURM_JOB_ID": "42", "SLURM_JOB_MAIL_TYPE": "Ended", "SLURM_JOB_STATE": "COMPLETED",
       "SLURM_JOB_USER": "alice"}
REPORT_JSON = {"jobs": [{"job": "42", "gpus": 2, "busy_ratio": 0.5, "notes": []}]}


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def _send(tmp_path: Path, report_body: str, timeout: float = 2.0,
          stdin: bytes = b"") -> tuple[list[str], bytes, float, str]:
    inbox = tmp_path / "inbox"
    mailer = _script(tmp_path / "mail", f'printf "%s\\n" "$@" > {inbox}.args\n'
                                         f"cat > {inbox}.body\n")
    report = _script(tmp_path / "report", report_body)
    config = tmp_path / "mail.toml"
    config.write_text(f'mailer = "{mailer}"\nreport = "{report}"\n'
                      f"summary_timeout_seconds = {timeout}\n")
    started = time.monotonic()
    run = subprocess.run([WRAPPER, *ARGS], input=stdin, capture_output=True, timeout=60,
                         env={**ENV, "SLURM_GPU_MAIL_CONFIG": str(config)}, check=False)
    took = time.monotonic() - started
    assert run.returncode == 0, run.stderr
    args = Path(f"{inbox}.args").read_text().splitlines()
    return args, Path(f"{inbox}.body").read_bytes(), took, run.stderr.decode()


def test_summary_is_added_and_slurms_arguments_pass_unchanged(tmp_path: Path) -> None:
    (tmp_path / "answer.json").write_text(json.dumps(REPORT_JSON))
    args, body, _, log = _send(tmp_path, f"cat {tmp_path / 'answer.json'}\n",
                               stdin=b"Slurm's own text\n")
    assert args == ARGS
    assert body.startswith(b"Slurm's own text\n\nGPU and CPU efficiency of job 42"), body
    assert b"GPU busy:  50%" in body and "summary of job 42 added" in log


@pytest.mark.parametrize("report_body, reason", [
    ("exec sleep 60\n", "did not answer within 1."),
    ("sleep 60 & exec sleep 60\n", "did not answer within 1."),  # a child holding the pipe
    ("echo 'slurm-gpu-report: cannot reach Prometheus' >&2; exit 3\n", "report failed (3)"),
    ("exit 5\n", "no metrics for the job"),
    ("echo '{not json'\n", "no figures for the job"),
])
def test_without_a_summary_slurms_mail_goes_unchanged_in_bounded_time(
        tmp_path: Path, report_body: str, reason: str) -> None:
    args, body, took, log = _send(tmp_path, report_body, timeout=1.5, stdin=b"as is\n")
    assert args == ARGS and body == b"as is\n"
    assert reason in log, log
    assert took < 5, took


def test_a_newline_in_the_subject_cannot_start_a_header() -> None:
    assert inert_arguments(["-s", "Slurm Job_id=1 Name=x\nBcc: evil@example.org Ended",
                            "alice"]) == [
        "-s", "Slurm Job_id=1 Name=x Bcc: evil@example.org Ended", "alice"]
