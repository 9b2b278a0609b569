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


def _wrapper(config: Path, stdin: bytes = b"", env: dict[str, str] | None = None,
             args: list[str] = ARGS) -> tuple[subprocess.CompletedProcess[bytes], float]:
    """The wrapper run as slurmctld runs MailProg: Slurm's arguments, SLURM_* variables
    only (no PATH), Slurm's text on stdin."""
    started = time.monotonic()
    run = subprocess.run([WRAPPER, *args], input=stdin, capture_output=True, timeout=60,
                         env={**(ENV if env is None else env),
                              "SLURM_GPU_MAIL_CONFIG": str(config)}, check=False)
    return run, time.monotonic() - started


def _mailer(tmp_path: Path, exit_status: int = 0) -> tuple[str, Path]:
    """A site mailer (not /usr/bin/mail) that records its argv and stdin."""
    inbox = tmp_path / "inbox"
    return _script(tmp_path / "site-mailer", f'printf "%s\\n" "$@" > {inbox}.args\n'
                                             f"cat > {inbox}.body\nexit {exit_status}\n"
                   ), inbox


def _received(inbox: Path) -> tuple[list[str], bytes]:
    return Path(f"{inbox}.args").read_text().splitlines(), Path(f"{inbox}.body").read_bytes()


def _send(tmp_path: Path, report_body: str, timeout: float = 2.0,
          stdin: bytes = b"") -> tuple[list[str], bytes, float, str]:
    mailer, inbox = _mailer(tmp_path)
    report = _script(tmp_path / "report", report_body)
    config = tmp_path / "mail.toml"
    config.write_text(f'mailer = "{mailer}"\nreport = "{report}"\n'
                      f"summary_timeout_seconds = {timeout}\n")
    run, took = _wrapper(config, stdin)
    assert run.returncode == 0, run.stderr
    args, body = _received(inbox)
    return args, body, took, run.stderr.decode()


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


def _answering_report(tmp_path: Path) -> str:
    (tmp_path / "answer.json").write_text(json.dumps(REPORT_JSON))
    return _script(tmp_path / "report", f"cat {tmp_path / 'answer.json'}\n")


def test_a_misspelt_key_still_sends_slurms_mail_whole_through_the_sites_mailer(
        tmp_path: Path) -> None:
    mailer, inbox = _mailer(tmp_path)
    config = tmp_path / "mail.toml"
    config.write_text(f'mailer = "{mailer}"\nreport = "{_answering_report(tmp_path)}"\n'
                      "sumary_timeout_seconds = 5\n")
    run, _ = _wrapper(config, b"Slurm's own text\n")
    log = run.stderr.decode()
    assert run.returncode == 0, log
    args, body = _received(inbox)
    assert args == ARGS
    assert body.startswith(b"Slurm's own text\n\nGPU and CPU efficiency of job 42"), body
    assert f"{config}: sumary_timeout_seconds: unknown key" in log, log
    assert "summary of job 42 added" in log and "as Slurm wrote it" not in log, log


def test_a_toml_syntax_error_keeps_the_sites_mailer_and_slurms_mail(tmp_path: Path) -> None:
    mailer, inbox = _mailer(tmp_path)
    config = tmp_path / "mail.toml"
    config.write_text(f'mailer = "{mailer}"\nprometheus_url = http://unquoted:9090\n')
    # a start mail: no summary, so the default report is not run
    run, _ = _wrapper(config, b"as is\n", env={**ENV, "SLURM_JOB_MAIL_TYPE": "Began",
                                                "SLURM_JOB_STATE": "RUNNING"})
    log = run.stderr.decode()
    assert run.returncode == 0, log
    assert _received(inbox) == (ARGS, b"as is\n")
    assert "not valid TOML" in log and f"mailer {mailer} read from its line" in log, log


@pytest.mark.parametrize("env, config_text", [
    ({**ENV, "SLURM_JOB_MAIL_TYPE": "Began", "SLURM_JOB_STATE": "RUNNING"}, ""),  # no summary
    (ENV, "report = '/nonexistent/slurm-gpu-report'\n"),  # the report cannot run
])
def test_a_mail_without_a_summary_keeps_slurms_body_whole(
        tmp_path: Path, env: dict[str, str], config_text: str) -> None:
    mailer, inbox = _mailer(tmp_path)
    config = tmp_path / "mail.toml"
    config.write_text(f'mailer = "{mailer}"\n{config_text}')
    text = b"Slurm's text\nline two, no newline at the end"
    run, _ = _wrapper(config, text, env=env)
    assert run.returncode == 0, run.stderr
    assert _received(inbox) == (ARGS, text)
    assert "mail sent as Slurm wrote it" in run.stderr.decode()


def test_a_failing_mailer_is_logged_as_mail_not_sent(tmp_path: Path) -> None:
    mailer, _ = _mailer(tmp_path, exit_status=3)
    config = tmp_path / "mail.toml"
    config.write_text(f'mailer = "{mailer}"\nsumary = 1\n')
    run, _ = _wrapper(config, b"x\n", env={**ENV, "SLURM_JOB_MAIL_TYPE": "Began",
                                            "SLURM_JOB_STATE": "RUNNING"})
    log = run.stderr.decode()
    assert run.returncode == 3, log  # the mailer's own status, as before
    assert f"job 42: mail NOT sent: the mailer {mailer} exited with 3" in log, log
    assert "mail sent" not in log, log


def test_a_mailer_past_its_time_is_stopped_and_logged_as_mail_not_sent(
        tmp_path: Path) -> None:
    mailer = _script(tmp_path / "slow-mailer", "exec sleep 60\n")
    config = tmp_path / "mail.toml"
    config.write_text(f'mailer = "{mailer}"\nmailer_timeout_seconds = 1\n')
    run, took = _wrapper(config, b"x\n", env={**ENV, "SLURM_JOB_MAIL_TYPE": "Began",
                                               "SLURM_JOB_STATE": "RUNNING"})
    log = run.stderr.decode()
    assert run.returncode == 1, log
    assert f"mail NOT sent: the mailer {mailer} did not finish within 1.0 s" in log, log
    assert took < 30, took


def test_an_array_tasks_mail_asks_the_report_for_the_task_as_a_t(tmp_path: Path) -> None:
    answer = tmp_path / "answer.json"
    answer.write_text(json.dumps({"jobs": [{"job": "1234_5", "gpus": 2, "busy_ratio": 0.5,
                                            "notes": []}]}))
    report = _script(tmp_path / "report",
                     f'printf "%s\\n" "$@" > {tmp_path}/report.args\ncat {answer}\n')
    mailer, inbox = _mailer(tmp_path)
    config = tmp_path / "mail.toml"
    config.write_text(f'mailer = "{mailer}"\nreport = "{report}"\n')
    args = ["-s", "Slurm Array Task Job_id=1234_5 (1235) Name=x Ended, Run time 00:10:00, "
                  "COMPLETED, ExitCode 0", "alice"]
    env = {**ENV, "SLURM_JOB_ID": "1235", "SLURM_ARRAY_JOB_ID": "1234",
           "SLURM_ARRAY_TASK_ID": "5"}
    run, _ = _wrapper(config, b"as is\n", env=env, args=args)
    log = run.stderr.decode()
    assert run.returncode == 0, log
    asked = (tmp_path / "report.args").read_text().splitlines()
    assert asked[:4] == ["job", "1234_5", "--format", "json"], asked
    got_args, body = _received(inbox)
    assert got_args == args
    assert body.startswith(b"as is\n\nGPU and CPU efficiency of job 1234_5"), body
    assert "summary of job 1234_5 added" in log, log
