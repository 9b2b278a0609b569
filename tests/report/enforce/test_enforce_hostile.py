"""enforce against text users choose and one job's failure: a job name with CR/LF in a
mail subject, a user name that would add recipients, a send that fails; and the files
that hold users' data, owner-only whatever the umask. Real SMTP (aiosmtpd); no Slurm,
no Prometheus: the decisions are given."""

from __future__ import annotations

import email
import json
import os
import stat
from collections.abc import Iterator
from email import policy as email_policy
from pathlib import Path

import pytest

from slurm_gpu_exporter.node.state_dir import StateStore
from slurm_gpu_exporter.report.enforce.decisions import Decision
from slurm_gpu_exporter.report.enforce.policy import parse_policy
from slurm_gpu_exporter.report.enforce.run import EnforceOptions, act_all
from slurm_gpu_exporter.report.enforce.state import EnforceState
from slurm_gpu_exporter.report.figures.shapes import JobUsage
from slurm_gpu_exporter.report.notify.notices import NotifyState
from slurm_gpu_exporter.report.notify.send import EXIT_NOTIFY
from slurm_gpu_exporter.report.prometheus.queries import Filters

NOW = 1_800_000_000.0
# A name that would end the Subject header and add a recipient, were it not made plain.
CRLF_NAME = "train\r\nBcc: victim@example.org\r\nX-Evil: 1"
POLICY = parse_policy('[messages]\nwarning_subject = "Job {jobid} ({name}) is idle"\n')


def warn(jobid: str, user: str = "ann", name: str = "train") -> Decision:
    return Decision(jobid=jobid, user=user, account="lab", partition="gpu", name=name,
                    gpus=1, nodes=("gpu01",), idle_for_s=3600.0, action="warn",
                    reason="idle for 1h: warning 1 of 2", warning=1, cancel_at=NOW + 3600)


def options(tmp_path: Path, notify: str) -> EnforceOptions:
    return EnforceOptions(policy=POLICY, cancel=True, state_path=tmp_path / "enforce.json",
                          filters=Filters(), notify=notify, mail_to="{user}@example.org")


@pytest.fixture
def umask_zero() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_a_crlf_job_name_in_the_subject_is_one_plain_line_and_later_jobs_are_warned(
        smtp_inbox: tuple[str, list[bytes]], tmp_path: Path) -> None:
    """Issue 33: with ``{name}`` in the subject, a name holding CR/LF made EmailMessage
    raise ValueError out of the run, so the jobs after it were never warned."""
    target, inbox = smtp_inbox
    opts = options(tmp_path, target)
    state = EnforceState(opts.state_path)
    failures = act_all([warn("11", name=CRLF_NAME), warn("12", user="bo")], state, opts, NOW)
    assert failures == set()
    mails = [email.message_from_bytes(raw, policy=email_policy.default) for raw in inbox]
    assert [m["To"] for m in mails] == ["ann@example.org", "bo@example.org"]
    subject = mails[0]["Subject"]
    assert "\n" not in subject and "\r" not in subject and "Bcc" in subject
    assert mails[0]["Bcc"] is None and mails[0]["X-Evil"] is None
    assert set(state.warnings()) == {"11", "12"}


def test_one_jobs_failure_is_its_error_line_and_the_run_goes_on(
        smtp_inbox: tuple[str, list[bytes]], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """A user name that would name other recipients gets no mail (the recipient check
    notify makes), and the job after it is warned; the exit code says a job failed."""
    target, inbox = smtp_inbox
    opts = options(tmp_path, target)
    state = EnforceState(opts.state_path)
    failures = act_all([warn("21", user="eve,boss@example.org"), warn("22")], state, opts,
                       NOW)
    assert failures == {EXIT_NOTIFY}
    assert len(inbox) == 1 and b"To: ann@example.org" in inbox[0]
    assert set(state.warnings()) == {"22"}
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "job 21" in errors[0] and "mail address" in errors[0]


def test_enforce_and_notify_state_and_the_agents_state_are_owner_only_under_umask_0(
        tmp_path: Path, umask_zero: None) -> None:
    enforce_state = EnforceState(tmp_path / "enforce" / "enforce.json")
    enforce_state.add_warning("1", NOW)
    notify_state = NotifyState(tmp_path / "notify" / "notified.json")
    notify_state.mark([JobUsage(jobid="1", user="ann")], NOW, 86400)
    agent_state = StateStore(tmp_path / "agent")
    agent_state.save({"jobs": {"1": {"user": "ann"}}})
    for path in (enforce_state.path, notify_state.path, agent_state.path):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert json.loads(notify_state.path.read_text()) == {"1": NOW}
