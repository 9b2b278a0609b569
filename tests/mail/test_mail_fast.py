"""slurm-gpu-mail's parts in this process, in words: how the report and the mailer are
started (their commands stand in as recording fakes of subprocess, so nothing is run),
what each failure leaves in the log, the whole summary text line by line, the config's
problems, the budget's edges, and the log lines reaching a syslog socket."""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_exporter.mail import cli, summary
from slurm_gpu_exporter.mail.budget import fit_summary, mailer_time, summary_time_left
from slurm_gpu_exporter.mail.config import (
    ConfigProblem,
    MailConfig,
    load_mail_config,
    settings_from,
    unknown_key_problem,
)
from slurm_gpu_exporter.mail.summary import (
    NoSummary,
    job_in_answer,
    jobid_to_summarize,
    report_json,
    summary_text,
)

CONFIG = MailConfig(mailer="/usr/sbin/sendmail", report="/opt/x/bin/slurm-gpu-report",
                    prometheus_url="http://prom:9090", report_args=("--ca-file", "/ca.pem"))


class FakePopen:
    """subprocess.Popen as report_json uses it: what it was started with, and an answer."""

    started: list[tuple[list[str], dict[str, Any]]] = []
    answer: tuple[bytes, bytes, int] = (b"", b"", 0)
    hangs = False
    pid = 4242

    def __init__(self, argv: list[str], **kwargs: Any) -> None:
        FakePopen.started.append((argv, kwargs))
        self.returncode: int | None = None
        self.timeouts: list[float | None] = []

    def communicate(self, timeout: float | None = None) -> tuple[bytes, bytes]:
        self.timeouts.append(timeout)
        if FakePopen.hangs and timeout is not None:
            raise subprocess.TimeoutExpired("report", timeout)
        out, err, self.returncode = FakePopen.answer
        return out, err


@pytest.fixture
def popen(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakePopen]]:
    FakePopen.started, FakePopen.answer, FakePopen.hangs = [], (b"", b"", 0), False
    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    yield FakePopen


def _answer(*jobs: dict[str, Any]) -> bytes:
    return json.dumps({"jobs": list(jobs)}).encode()


def test_the_report_is_asked_in_a_session_of_its_own_with_the_sites_flags(
        popen: type[FakePopen]) -> None:
    popen.answer = (_answer({"job": "7"}, {"job": "42", "gpus": 1}), b"", 0)
    assert report_json(CONFIG, "42", 3.5) == {"job": "42", "gpus": 1}
    ((argv, kwargs),) = popen.started
    assert argv == ["/opt/x/bin/slurm-gpu-report", "job", "42", "--format", "json",
                    "--prometheus-url", "http://prom:9090", "--ca-file", "/ca.pem"]
    assert kwargs == {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE,
                      "stderr": subprocess.PIPE, "start_new_session": True}
    popen.started.clear()
    report_json(MailConfig(report="/r"), "42", 1.0)
    assert popen.started[0][0] == ["/r", "job", "42", "--format", "json"]


@pytest.mark.parametrize(("answer", "why"), [
    ((b"", b"", 5), "no metrics for the job (shorter than a sample, or not scraped)"),
    ((b"", b"first\nQuery failed: 503\n", 2), "the report failed (2): Query failed: 503"),
    ((b"", b"", 1), "the report failed (1): no message"),
    ((b"", b"x" * 400, 3), "the report failed (3): " + "x" * 300),
    ((b"{}", b"", 0), "the report's answer has no figures for the job"),
])
def test_a_report_without_figures_says_why(popen: type[FakePopen],
                                           answer: tuple[bytes, bytes, int], why: str) -> None:
    popen.answer = answer
    with pytest.raises(NoSummary) as caught:
        report_json(CONFIG, "42", 3.0)
    assert str(caught.value) == why


def test_a_report_past_its_time_is_killed_with_its_session(
        popen: type[FakePopen], monkeypatch: pytest.MonkeyPatch) -> None:
    killed: list[tuple[int, int]] = []
    monkeypatch.setattr(summary.os, "killpg", lambda pid, sig: killed.append((pid, sig)))
    popen.hangs = True
    with pytest.raises(NoSummary) as caught:
        report_json(CONFIG, "42", 1.25)
    assert str(caught.value) == "the report did not answer within 1.2 s"
    assert killed == [(4242, signal.SIGKILL)]


def test_a_report_that_cannot_start_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(argv: list[str], **kwargs: Any) -> None:
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(subprocess, "Popen", refuse)
    with pytest.raises(NoSummary) as caught:
        report_json(CONFIG, "42", 1.0)
    assert str(caught.value) == "cannot run /opt/x/bin/slurm-gpu-report: Permission denied"


def test_an_answer_too_large_is_not_read() -> None:
    with pytest.raises(NoSummary) as caught:
        job_in_answer(b" " * ((4 << 20) + 1), "42")
    assert str(caught.value) == "the report's answer is too large"
    padded = _answer({"job": "42"}).ljust(4 << 20)
    assert job_in_answer(padded, "42") == {"job": "42"}


# -- the mailer --------------------------------------------------------------------------

@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], dict[str, Any]]]:
    ran: list[tuple[list[str], dict[str, Any]]] = []

    def fake(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        ran.append((argv, kwargs))
        return subprocess.CompletedProcess(argv, 0)
    monkeypatch.setattr(subprocess, "run", fake)
    return ran


def test_the_mailer_gets_the_message_and_slurms_arguments_made_inert(
        run: list[tuple[list[str], dict[str, Any]]]) -> None:
    assert cli.deliver("/usr/bin/mail", ["-s", "Job 1\nBcc: x", "alice"], b"body", 7.5) == (
        0, None)
    assert run == [(["/usr/bin/mail", "-s", "Job 1 Bcc: x", "alice"],
                    {"input": b"body", "timeout": 7.5, "check": False})]


@pytest.mark.parametrize(("fails", "said"), [
    (FileNotFoundError(2, "No such file or directory"),
     (1, "cannot run the mailer /m: No such file or directory; set mailer in /etc/x.toml")),
    (subprocess.TimeoutExpired("/m", 2.0), (1, "the mailer /m did not finish within 2.0 s")),
    (subprocess.CompletedProcess(["/m"], 75), (75, "the mailer /m exited with 75")),
])
def test_a_mailer_that_fails_says_how(monkeypatch: pytest.MonkeyPatch, fails: object,
                                      said: tuple[int, str]) -> None:
    def fake(argv: list[str], **kwargs: Any) -> object:
        if isinstance(fails, BaseException):
            raise fails
        return fails
    monkeypatch.setattr(subprocess, "run", fake)
    monkeypatch.setenv("SLURM_GPU_MAIL_CONFIG", "/etc/x.toml")
    assert cli.deliver("/m", ["-s", "s", "u"], b"", 2.0) == said


# -- the wrapper in this process -----------------------------------------------------------

@pytest.fixture
def wrapper(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """main() with the report and the mailer as fakes; what they were given."""
    seen: dict[str, Any] = {"asked": [], "handed": [], "body": b"Slurm's text"}

    def report(config: MailConfig, jobid: str, timeout: float) -> dict[str, Any]:
        seen["asked"].append((config, jobid))
        return {"job": jobid, "gpus": 1, "busy_ratio": 0.5}

    monkeypatch.setattr(cli, "report_json", report)
    monkeypatch.setattr(cli, "_slurms_body", lambda: seen["body"])
    monkeypatch.setattr(cli, "deliver", lambda mailer, argv, message, timeout:
                        seen["handed"].append((mailer, message)) or (0, None))
    monkeypatch.setattr(cli, "SYSLOG", str(tmp_path / "no-syslog"))
    monkeypatch.setenv("SLURM_GPU_MAIL_CONFIG", str(tmp_path / "mail.toml"))
    (tmp_path / "mail.toml").write_text('mailer = "/usr/sbin/sendmail"\nsummary_timeout = 3\n')
    for name in list(cli.os.environ):
        if name.startswith(("SLURM_ARRAY", "SLURM_JOB")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_JOB_STATE", "COMPLETED")
    before = list(cli.log.handlers)
    yield seen
    for handler in cli.log.handlers[len(before):]:
        cli.log.removeHandler(handler)
        handler.close()


SUMMARY = ("GPU and CPU efficiency of job 42 (slurm-gpu-report):\n\n  GPUs held: 1\n"
           "  GPU busy:  50%\n\n  Details: slurm-gpu-report job 42\n")


@pytest.mark.parametrize(("body", "message"), [
    (b"Slurm's text", b"Slurm's text\n\n" + SUMMARY.encode()),
    (b"Slurm's text\n", b"Slurm's text\n\n" + SUMMARY.encode()),
    (b"", SUMMARY.encode()),
])
def test_the_summary_follows_slurms_text_after_a_blank_line(
        wrapper: dict[str, Any], capsys: pytest.CaptureFixture[str], body: bytes,
        message: bytes) -> None:
    wrapper["body"] = body
    assert cli.main(["-s", "Slurm Job_id=42 Ended", "alice"]) == 0
    assert wrapper["handed"] == [("/usr/sbin/sendmail", message)]
    ((config, jobid),) = wrapper["asked"]
    assert jobid == "42" and config.mailer == "/usr/sbin/sendmail"
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("slurm-gpu-mail: ") and "summary_timeout" in err[0]
    assert err[-1].startswith("slurm-gpu-mail: job 42: summary of job 42 added (")


def test_a_mail_without_a_summary_is_logged_as_sent_as_slurm_wrote_it(
        wrapper: dict[str, Any], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_STATE", "RUNNING")
    assert cli.main(["-s", "Began", "alice"]) == 0
    assert wrapper["handed"] == [("/usr/sbin/sendmail", b"Slurm's text")]
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        "slurm-gpu-mail: job 42: mail sent as Slurm wrote it: not an end-of-job mail (type -, "
        "state RUNNING) (")


def test_a_summary_that_breaks_never_costs_the_mail(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(config: MailConfig, jobid: str, timeout: float) -> dict[str, Any]:
        raise RuntimeError("boom")
    monkeypatch.setattr(cli, "report_json", broken)
    monkeypatch.setattr(cli.os, "environ", {"SLURM_JOB_ID": "42", "SLURM_JOB_STATE": "FAILED"})
    started = cli.time.monotonic()
    assert cli._summary(MailConfig(), started, []) == (
        b"", "as Slurm wrote it: RuntimeError: boom")
    assert cli._summary(MailConfig(summary_timeout_s=1.0), started - 0.6, []) == (
        b"", "as Slurm wrote it: no time left for the summary")


def test_help_is_the_usage_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: slurm-gpu-mail -s SUBJECT USER   (slurm.conf: MailProg=")
    assert out.endswith("checks the config: one line per problem, exit 1 if any.\n")
    assert "Config: /etc/slurm-gpu-report/mail.toml (env SLURM_GPU_MAIL_CONFIG)." in out


def test_the_log_reaches_syslog_too(wrapper: dict[str, Any], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "log.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(5)
        monkeypatch.setattr(cli, "SYSLOG", path)
        (tmp_path / "mail.toml").write_text("")
        assert cli.main(["-s", "x", "alice"]) == 0
        got = sock.recv(4096).decode()
    assert got.startswith("<14>slurm-gpu-mail: job 42: summary of job 42 added (")


def test_a_log_file_that_cannot_be_written_is_said_once(
        wrapper: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mail.toml").write_text(f'log_file = "{tmp_path}/no/dir/mail.log"\n')
    assert cli.main(["-s", "x", "alice"]) == 0
    assert capsys.readouterr().err.splitlines()[0] == (
        f"slurm-gpu-mail: cannot write {tmp_path}/no/dir/mail.log: No such file or directory")


# -- which mails, and the summary's lines ---------------------------------------------

def test_a_subject_naming_another_task_says_so() -> None:
    env = {"SLURM_JOB_ID": "1240", "SLURM_JOB_STATE": "COMPLETED",
           "SLURM_ARRAY_JOB_ID": "1234", "SLURM_ARRAY_TASK_ID": "5"}
    with pytest.raises(NoSummary) as caught:
        jobid_to_summarize(env, "Slurm Array Task Job_id=1234_6 (1240) Name=x Ended")
    assert str(caught.value) == ("the subject's array task is not the one SLURM_JOB_ID and "
                                 "SLURM_ARRAY_* name")


def test_every_line_of_the_summary_in_its_order() -> None:
    job = {"job": "42", "gpus": 2, "gpu_hours": 3.456, "busy_ratio": 0.255,
           "sm_active_ratio": 0.2, "tensor_active_ratio": 0.05, "dram_active_ratio": 1,
           "gpu_memory_peak_gib": 30.55, "energy_kwh": 1.2345, "cpu_energy_kwh": 0.5,
           "emissions_gco2e": 308.6, "gpu_power_mean_w": 245.4, "cpu_efficiency": 0.5,
           "memory_peak_gib": 10.0, "memory_request_gib": 64,
           "gpu_throttled": ["GPU 0: power-capped 23% of its busy time"],
           "gpu_errors": ["Xid 79 on GPU 1"], "notes": ["note \x1b one", 5, "two"]}
    assert summary_text(job) == (
        "GPU and CPU efficiency of job 42 (slurm-gpu-report):\n\n"
        "  GPUs held:       2 (3.46 GPU-hours)\n"
        "  GPU busy:        26%\n"
        "  SM active:       20%\n"
        "  Tensor active:   5%\n"
        "  DRAM active:     100%\n"
        "  GPU memory peak: 30.6 GiB\n"
        "  GPU energy:      1.234 kWh\n"
        "  CPU+DRAM energy: 0.500 kWh (estimate)\n"
        "  Emissions:       309 gCO2e\n"
        "  GPU power:       245 W mean per GPU\n"
        "  CPU efficiency:  50%\n"
        "  Memory peak:     10.0 GiB of 64.0 GiB requested\n"
        "  GPU throttled:   GPU 0: power-capped 23% of its busy time\n"
        "  GPU error:       Xid 79 on GPU 1\n\n"
        "  Notes:\n  - note   one\n  - two\n\n"
        "  Details: slurm-gpu-report job 42\n")


def test_a_cpu_only_job_gets_its_cpu_lines_alone() -> None:
    assert summary_text({"job": "7", "gpus": 0, "gpu_hours": 1.0, "cpu_efficiency": 0.25,
                         "memory_peak_gib": 2.0, "gpu_errors": "not a list"}) == (
        "GPU and CPU efficiency of job 7 (slurm-gpu-report):\n\n"
        "  CPU efficiency: 25%\n  Memory peak:    2.0 GiB\n\n"
        "  Details: slurm-gpu-report job 7\n")
    text = summary_text({"job": "7", "gpus": 1})
    assert "GPUs held: 1\n" in text
    with pytest.raises(NoSummary) as caught:
        summary_text({"job": "7"})
    assert str(caught.value) == "the report knows no figure of the job"


def test_at_most_eight_lines_of_a_list_and_twenty_notes() -> None:
    text = summary_text({"job": "7", "gpus": 1, "gpu_errors": [f"e{i}" for i in range(10)],
                         "notes": [f"n{i}" for i in range(25)]})
    assert text.count("GPU error:") == 8 and "e7\n" in text and "e8" not in text
    assert "  - n19\n" in text and "n20" not in text


# -- the config, the budget --------------------------------------------------------------

def test_a_config_that_cannot_be_read_keeps_every_default(tmp_path: Path) -> None:
    loaded = load_mail_config(tmp_path)  # a directory
    assert loaded.config == MailConfig() and loaded.found
    assert loaded.problems == (ConfigProblem(
        "", "cannot be read (Is a directory); every setting is at its default"),)
    assert loaded.problems[0].line(tmp_path) == (
        f"{tmp_path}: cannot be read (Is a directory); every setting is at its default")


def test_an_unknown_key_names_the_nearest_or_every_known_one() -> None:
    assert unknown_key_problem("mailr").message == "unknown key, ignored (did you mean 'mailer'?)"
    assert unknown_key_problem("zzz").message == (
        "unknown key, ignored (known: log_file, mailer, mailer_timeout_seconds, "
        "prometheus_url, report, report_args, summary_timeout_seconds)")


def test_times_over_the_shared_budget_cut_the_summary_in_words() -> None:
    config, problems = settings_from({"summary_timeout_seconds": 60,
                                      "mailer_timeout_seconds": 50})
    assert config.summary_timeout_s == 50.0 and config.mailer_timeout_s == 50.0
    assert [p.message for p in problems] == [
        "60 + mailer_timeout_seconds 50 is over the 100 s both share inside slurmctld's "
        "120 s; the summary gets 50"]


def test_the_budgets_edges() -> None:
    assert fit_summary(10.0, 95.0) == 5.0 and fit_summary(10.0, 40.0) == 10.0
    assert summary_time_left(10.0, 40.0, 9.5) == 0.5
    assert summary_time_left(10.0, 40.0, 9.6) == 0.0
    assert mailer_time(40.0, 0.0) == 40.0 and mailer_time(40.0, 80.0) == 30.0
    assert mailer_time(40.0, 109.5) == 1.0


def test_logging_goes_to_stderr_with_the_programs_name(
        wrapper: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    cli._setup_logging(None)
    cli.log.info("hello")
    assert capsys.readouterr().err == "slurm-gpu-mail: hello\n"
    assert cli.log.level == logging.INFO and not cli.log.propagate
