"""Array jobs' end mails: a task's mail carries that task's summary, asked for as the
report names it (``1234_5``, not the task's own job id 1235); an array's summary mail
(all its tasks) carries none; odd SLURM_ARRAY_* values fall back to SLURM_JOB_ID and
never reach the report's command line. Subjects are Slurm's (src/slurmctld/agent.c,
mail_job_info). The report and the mailer are stood in for by functions
(test_wrapper.py runs the console script with real ones)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_exporter.mail import cli
from slurm_gpu_exporter.mail.config import MailConfig
from slurm_gpu_exporter.mail.summary import NoSummary, job_in_answer, jobid_to_summarize

END = {"SLURM_JOB_MAIL_TYPE": "Ended", "SLURM_JOB_STATE": "COMPLETED"}
TASK_ENV = {**END, "SLURM_JOB_ID": "1235", "SLURM_ARRAY_JOB_ID": "1234",
            "SLURM_ARRAY_TASK_ID": "5"}
TASK_SUBJECT = ("Slurm Array Task Job_id=1234_5 (1235) Name=sweep Ended, Run time 00:10:00, "
                "COMPLETED, ExitCode 0")
# The array's own record: the last task Slurm started (9) keeps the array's id.
SUMMARY_ENV = {**END, "SLURM_JOB_ID": "1234", "SLURM_ARRAY_JOB_ID": "1234",
               "SLURM_ARRAY_TASK_ID": "9"}
SUMMARY_SUBJECT = "Slurm Array Summary Job_id=1234_* (1234) Name=sweep Ended, COMPLETED, " \
                  "ExitCode [0-0]"
LAST_TASK_SUBJECT = "Slurm Array Task Job_id=1234_9 (1234) Name=sweep Ended, COMPLETED"


def test_an_array_tasks_mail_asks_for_the_task_as_the_report_names_it() -> None:
    assert jobid_to_summarize(TASK_ENV, TASK_SUBJECT) == "1234_5"
    assert jobid_to_summarize(TASK_ENV) == "1234_5"  # no subject: the environment says it


def test_the_last_started_tasks_own_mail_is_that_tasks() -> None:
    assert jobid_to_summarize(SUMMARY_ENV, LAST_TASK_SUBJECT) == "1234_9"


def test_an_arrays_summary_mail_gets_no_one_tasks_summary() -> None:
    with pytest.raises(NoSummary, match="summary mail"):
        jobid_to_summarize(SUMMARY_ENV, SUMMARY_SUBJECT)
    # Slurm's variables alone cannot tell the summary from the last task's mail.
    with pytest.raises(NoSummary, match="may be its summary"):
        jobid_to_summarize(SUMMARY_ENV)


def test_a_subject_naming_another_task_than_the_environment_gets_no_summary() -> None:
    with pytest.raises(NoSummary, match="not the one"):
        jobid_to_summarize({**TASK_ENV, "SLURM_ARRAY_TASK_ID": "6"}, TASK_SUBJECT)
    with pytest.raises(NoSummary, match="not the one"):
        jobid_to_summarize({**END, "SLURM_JOB_ID": "1235"}, TASK_SUBJECT)


def test_a_job_name_cannot_make_a_mail_an_arrays() -> None:
    plain = {**END, "SLURM_JOB_ID": "42"}
    assert jobid_to_summarize(plain, "Slurm Job_id=42 Name=Slurm Array Summary "
                                     "Job_id=42_* (42) Name=x Ended") == "42"
    named = ("Slurm Array Task Job_id=1234_5 (1235) Name=Slurm Array Summary "
             "Job_id=1234_* (1234) Name=x Ended")
    assert jobid_to_summarize(TASK_ENV, named) == "1234_5"


@pytest.mark.parametrize(("array_job", "task"), [
    ("1234", "5 --db sqlite:////tmp/x"), ("1234", "-5"), ("1234", "05"), ("1234", "\u0665"),
    ("1234", "4294967294"), ("1234", ""), ("", "5"), ("0", "5"), ("1234;x", "5"),
    ("--prometheus-url=http://evil", "5"), ("1234", "5\n"), ("\u0661\u0662", "5"),
])
def test_odd_array_variables_fall_back_to_the_plain_job_id(array_job: str, task: str) -> None:
    env = {**END, "SLURM_JOB_ID": "1235", "SLURM_ARRAY_JOB_ID": array_job,
           "SLURM_ARRAY_TASK_ID": task}
    assert jobid_to_summarize(env) == "1235"


def test_the_answer_is_matched_by_the_name_asked() -> None:
    answer = json.dumps({"jobs": [{"job": "1234_5", "gpus": 1}]}).encode()
    assert job_in_answer(answer, "1234_5") == {"job": "1234_5", "gpus": 1}
    with pytest.raises(NoSummary, match="no figures"):
        job_in_answer(answer, "1235")  # what the mail asked before: never matched
    with pytest.raises(NoSummary, match="no figures"):
        job_in_answer(json.dumps({"jobs": ["1234_5", None]}).encode(), "1234_5")


@pytest.fixture
def wrapper(monkeypatch: pytest.MonkeyPatch, tmp_path: Path
            ) -> Iterator[tuple[list[str], list[tuple[list[str], bytes]]]]:
    """slurm-gpu-mail in this process: the names the report was asked for, and what the
    mailer was handed (arguments, message)."""
    asked: list[str] = []
    handed: list[tuple[list[str], bytes]] = []

    def report(_config: MailConfig, jobid: str, _timeout: float) -> dict[str, Any]:
        asked.append(jobid)
        if jobid != "1234_5":
            raise NoSummary("no metrics for the job")
        return {"job": "1234_5", "gpus": 2, "busy_ratio": 0.5, "notes": []}

    monkeypatch.setattr(cli, "report_json", report)
    monkeypatch.setattr(cli, "_slurms_body", lambda: b"Slurm's text\n")
    monkeypatch.setattr(cli, "deliver", lambda _mailer, argv, message, _timeout:
                        handed.append((list(argv), message)) or (0, None))
    monkeypatch.setattr(cli, "SYSLOG", str(tmp_path / "no-syslog"))
    monkeypatch.setenv("SLURM_GPU_MAIL_CONFIG", str(tmp_path / "none.toml"))
    for name in list(cli.os.environ):
        if name.startswith("SLURM_ARRAY") or name.startswith("SLURM_JOB"):
            monkeypatch.delenv(name)
    before = list(cli.log.handlers)
    yield asked, handed
    for handler in cli.log.handlers[len(before):]:
        cli.log.removeHandler(handler)
        handler.close()


def test_an_array_tasks_end_mail_carries_that_tasks_summary(
        wrapper: tuple[list[str], list[tuple[list[str], bytes]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked, handed = wrapper
    for name, value in TASK_ENV.items():
        monkeypatch.setenv(name, value)
    args = ["-s", TASK_SUBJECT, "alice"]
    assert cli.main(list(args)) == 0
    assert asked == ["1234_5"]
    ((argv, message),) = handed
    assert argv == args
    assert message.startswith(b"Slurm's text\n\nGPU and CPU efficiency of job 1234_5 ")
    assert b"GPU busy:" in message and b"50%" in message


def test_an_arrays_summary_mail_goes_as_slurm_wrote_it_without_asking_the_report(
        wrapper: tuple[list[str], list[tuple[list[str], bytes]]],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    asked, handed = wrapper
    for name, value in SUMMARY_ENV.items():
        monkeypatch.setenv(name, value)
    args = ["-s", SUMMARY_SUBJECT, "alice"]
    assert cli.main(list(args)) == 0
    assert asked == [] and handed == [(args, b"Slurm's text\n")]
    assert "an array's summary mail" in capsys.readouterr().err
