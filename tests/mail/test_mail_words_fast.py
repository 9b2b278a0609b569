"""slurm-gpu-mail's words at their edges: which mails Slurm's variables and subject make
end-of-job mails, each reason a mail goes without a summary, every config problem's line,
``--check``'s own command line, and what main() logs when the mailer fails."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_exporter.mail import check, cli
from slurm_gpu_exporter.mail.check import check_main, is_check, problems_of
from slurm_gpu_exporter.mail.config import (
    ConfigProblem,
    LoadedConfig,
    MailConfig,
    load_mail_config,
    salvage_mailer,
    settings_from,
)
from slurm_gpu_exporter.mail.summary import (
    NoSummary,
    jobid_to_summarize,
    mail_subject,
    summary_text,
)


def _why(env: dict[str, str], subject: str = "") -> str:
    with pytest.raises(NoSummary) as caught:
        jobid_to_summarize(env, subject)
    return str(caught.value)


# -- which mails get a summary ----------------------------------------------------------

def test_slurms_state_and_mail_type_are_read_in_their_own_words() -> None:
    assert jobid_to_summarize({"SLURM_JOB_ID": "7", "SLURM_JOB_STATE": "CANCELLED by 1000"}
                              ) == "7"
    assert jobid_to_summarize({"SLURM_JOB_ID": "7",
                               "SLURM_JOB_MAIL_TYPE": " Reached time limit "}) == "7"
    assert _why({"SLURM_JOB_ID": "7", "SLURM_JOB_MAIL_TYPE": "Began"}) == (
        "not an end-of-job mail (type began, state -)")
    assert _why({"SLURM_JOB_ID": "7"}) == "not an end-of-job mail (type -, state -)"
    assert _why({"SLURM_JOB_STATE": "FAILED"}) == "no job id in SLURM_JOB_ID"


def test_an_arrays_mails_without_one_tasks_subject_say_why() -> None:
    env = {"SLURM_JOB_ID": "1234", "SLURM_JOB_STATE": "COMPLETED",
           "SLURM_ARRAY_JOB_ID": "1234", "SLURM_ARRAY_TASK_ID": "9"}
    assert _why(env, "Slurm Array Summary Job_id=1234_* (1234) Name=x Ended") == (
        "an array's summary mail (all its tasks): no one task's figures to add; "
        "--mail-type=ARRAY_TASKS mails each task with its own")
    assert _why(env) == ("an array's mail that may be its summary (the subject does not say "
                         "it is one task's)")
    # An array's record that names no task is asked for as the job it is.
    assert jobid_to_summarize(env | {"SLURM_ARRAY_TASK_ID": ""}) == "1234"


def test_the_subject_is_slurms_argument_after_s() -> None:
    assert mail_subject(["-s", "Slurm Job_id=7 Ended"]) == "Slurm Job_id=7 Ended"
    assert mail_subject(["-s"]) == "" and mail_subject(["-t", "x", "u"]) == ""


def test_long_texts_are_cut_where_the_summary_says() -> None:
    text = summary_text({"job": "1" * 30, "gpus": 1, "gpu_errors": ["e" * 250],
                         "notes": ["n" * 350]})
    lines = text.splitlines()
    assert lines[0] == f"GPU and CPU efficiency of job {'1' * 20} (slurm-gpu-report):"
    assert lines[-1] == f"  Details: slurm-gpu-report job {'1' * 20}"
    assert f"  GPU error: {'e' * 200}" in lines and f"  - {'n' * 300}" in lines


def test_a_report_that_fails_in_bytes_that_are_no_utf8_is_read(monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    import subprocess

    from tests.mail.test_mail_fast import CONFIG, FakePopen
    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    FakePopen.answer, FakePopen.hangs = (b"", b"bad \xff byte\n", 2), False
    from slurm_gpu_exporter.mail.summary import report_json
    with pytest.raises(NoSummary) as caught:
        report_json(CONFIG, "7", 1.0)
    assert str(caught.value) == "the report failed (2): bad \ufffd byte"


# -- the config file's problems ---------------------------------------------------------

@pytest.mark.parametrize(("data", "lines"), [
    ({"mailer": "mail"}, ["mailer: must be an absolute path (slurmctld gives MailProg no PATH); "
                          "the default (/usr/bin/mail) is used"]),
    ({"report": "/opt/\x00x"}, ["report: must be an absolute path (slurmctld gives MailProg no "
                                "PATH); the default is used"]),
    ({"prometheus_url": 5}, ["prometheus_url: must be a string; the default is used"]),
    ({"mailer_timeout_seconds": True}, ["mailer_timeout_seconds: must be a number of seconds, "
                                        "more than 0; the default is used"]),
    ({"mailer_timeout_seconds": 0.5}, []),
])
def test_each_bad_value_says_what_it_must_be(data: dict[str, Any], lines: list[str]) -> None:
    config, problems = settings_from(data)
    assert [f"{p.key}: {p.message}" for p in problems] == lines
    if not lines:
        assert config.mailer_timeout_s == 0.5


def test_a_file_that_is_no_toml_says_why_and_what_it_kept(tmp_path: Path) -> None:
    path = tmp_path / "mail.toml"
    path.write_text("a = ")
    (problem,) = load_mail_config(path).problems
    assert problem == ConfigProblem("", "not valid TOML (Invalid value (at end of document)); "
                                        "every setting at its default")
    path.write_bytes(b'mailer = "/usr/sbin/sendmail"\nx = "\xff"\n')
    loaded = load_mail_config(path)
    assert loaded.config.mailer == "/usr/sbin/sendmail"
    assert loaded.problems == (ConfigProblem(
        "", "not valid TOML (not UTF-8); mailer /usr/sbin/sendmail read from its line, every "
            "other setting at its default"),)


def test_a_mailer_line_is_salvaged_from_the_top_level_only() -> None:
    assert salvage_mailer('mailer = "/usr/sbin/sendmail"\n[t]\nmailer = "/x"\n=') == (
        "/usr/sbin/sendmail")
    assert salvage_mailer('[t]\nmailer = "/x"\n') is None


def test_a_problems_key_is_cut_and_made_printable_in_its_line() -> None:
    problem = ConfigProblem("k\n" + "x" * 200, "bad")
    assert problem.line(Path("/m.toml")) == "/m.toml: k?" + "x" * 98 + ": bad"


# -- --check -----------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "checks"), [
    (["--check"], True), (["--config", "/x"], True), (["--config=/x"], True),
    (["--configx"], False), (["-s", "--check", "u"], False), ([], False),
    (["--CHECK"], False), (["-s", "--config=/x"], False),
])
def test_a_check_is_asked_by_its_first_argument(args: list[str], checks: bool) -> None:
    assert is_check(args) is checks


def test_check_needs_check_and_names_itself(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        check_main(["--config", "/x"])
    assert caught.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "slurm-gpu-mail --check: error: the following arguments are required: --check")
    with pytest.raises(SystemExit):
        check_main(["--check", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("usage: slurm-gpu-mail --check [-h] --check [--config CONFIG] ")
    assert ("[--config CONFIG] Check slurm-gpu-mail's config: one line per problem, exit 1 "
            "if any. options:") in out
    assert ("--config CONFIG the file to check (default $SLURM_GPU_MAIL_CONFIG or "
            "/etc/slurm-gpu-report/mail.toml)") in out


def test_check_without_a_file_says_the_defaults_are_ok(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_GPU_MAIL_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setattr(check, "_program", lambda key, path: None)
    assert check_main(["--check"]) == 0
    assert capsys.readouterr().out == (
        f"{tmp_path}/none.toml: no file: every setting at its default, ok "
        "(mailer /usr/bin/mail)\n")


def test_check_names_a_program_that_is_no_file_and_a_log_dir_that_is_none(
        tmp_path: Path) -> None:
    config = MailConfig(mailer=str(tmp_path), report=str(tmp_path / "none"),
                        log_file=tmp_path / "no" / "mail.log")
    assert problems_of(LoadedConfig(config)) == [
        ConfigProblem("mailer", f"{tmp_path} is no file"),
        ConfigProblem("report", f"{tmp_path}/none does not exist"),
        ConfigProblem("log_file", f"{tmp_path}/no is no directory")]


# -- main() when the mailer fails ----------------------------------------------------------

@pytest.fixture
def failing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[Any]]:
    handed: list[Any] = []
    monkeypatch.setattr(cli, "_slurms_body", lambda: b"text")
    monkeypatch.setattr(cli, "deliver", lambda mailer, argv, message, timeout:
                        handed.append((argv, timeout)) or (75, "the mailer /m exited with 75"))
    monkeypatch.setattr(cli, "report_json", lambda config, jobid, timeout:
                        handed.append(("report", timeout)) or {"job": jobid, "gpus": 1})
    monkeypatch.setattr(cli, "SYSLOG", str(tmp_path / "no-syslog"))
    config = tmp_path / "mail.toml"
    config.write_text(f'log_file = "{tmp_path}/mail.log"\nmailr = "x"\n')
    monkeypatch.setenv("SLURM_GPU_MAIL_CONFIG", str(config))
    for name in list(cli.os.environ):
        if name.startswith(("SLURM_ARRAY", "SLURM_JOB")):
            monkeypatch.delenv(name)
    before = list(cli.log.handlers)
    yield handed
    for handler in cli.log.handlers[len(before):]:
        cli.log.removeHandler(handler)
        handler.close()


@pytest.mark.parametrize(("jobid", "shown", "went"), [
    ("42", "42", "with the summary"),
    ("1" * 25, "1" * 20, "as Slurm wrote it: no job id in SLURM_JOB_ID"),
])
def test_a_mail_the_mailer_refused_is_logged_as_not_sent(
        failing: list[Any], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, jobid: str, shown: str, went: str) -> None:
    monkeypatch.setattr(sys, "argv", ["slurm-gpu-mail", "-s", "Job", "alice"])
    monkeypatch.setenv("SLURM_JOB_ID", jobid)
    monkeypatch.setenv("SLURM_JOB_STATE", "COMPLETED")
    assert cli.main() == 75
    (argv, timeout) = failing[-1]
    assert argv == ["-s", "Job", "alice"] and 39.0 < timeout <= 40.0
    if jobid == "42":  # the summary's own time: its default, 10 s, less what passed
        assert failing[0][0] == "report" and 9.0 < failing[0][1] <= 10.0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"slurm-gpu-mail: {tmp_path}/mail.toml: mailr: unknown key, ignored "
                      "(did you mean 'mailer'?)")
    assert err[-1].startswith(f"slurm-gpu-mail: job {shown}: mail NOT sent: the mailer /m "
                              f"exited with 75 (it was to go {went}) (")
    assert re.fullmatch(r"\d+\.\d s\)", err[-1].rsplit("(", 1)[1])
    assert float(err[-1].rsplit("(", 1)[1][:-3]) < 5
    logged = (tmp_path / "mail.log").read_text().splitlines()
    assert re.fullmatch(rf"\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d,\d{{3}} job {shown}: mail NOT "
                        r"sent: .*", logged[-1])


def test_without_a_job_id_the_log_says_dash(failing: list[Any],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-s", "Job", "alice"]) == 75
    assert re.fullmatch(r"slurm-gpu-mail: job -: mail NOT sent: the mailer /m exited with 75 "
                        r"\(it was to go as Slurm wrote it: not an end-of-job mail \(type -, "
                        r"state -\)\) \(\d+\.\d s\)", capsys.readouterr().err.splitlines()[-1])


def test_short_help_is_the_usage_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-h"]) == 0
    assert capsys.readouterr().out.startswith("usage: slurm-gpu-mail -s SUBJECT USER")


def test_slurms_body_is_read_from_stdin_unless_a_person_types(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"Slurm's body\n")))
    monkeypatch.setattr(cli.os, "isatty", lambda fd: fd != 0)
    assert cli._slurms_body() == b"Slurm's body\n"
    monkeypatch.setattr(cli.os, "isatty", lambda fd: fd == 0)
    assert cli._slurms_body() == b""
    monkeypatch.setattr(cli.os, "isatty", lambda fd: False)
    closed = io.TextIOWrapper(io.BytesIO(b"x"))
    closed.close()
    monkeypatch.setattr(sys, "stdin", closed)
    assert cli._slurms_body() == b""


def test_main_hands_a_check_to_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    missing = tmp_path / "mial.toml"
    assert cli.main(["--check", "--config", str(missing)]) == 1
    assert capsys.readouterr().err.splitlines()[0] == f"{missing}: does not exist"
