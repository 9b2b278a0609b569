"""The admins' review (``low-util --report-to/--out-dir``): the mail's parts and headers,
the dated file, the checks on the flags. The real run (Prometheus, an SMTP server,
Chromium) is in test_review_real.py."""

from __future__ import annotations

import stat
from dataclasses import replace
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path

import pytest

from slurm_gpu_exporter.report.cli.main import main
from slurm_gpu_exporter.report.cli.review import ReviewPlan, deliver_review
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.notify.review import (
    parse_recipients,
    review_file_name,
    review_message,
)
from tests.report.sample_data import FLAGGED, empty_low_util_report, low_util_report
from tests.support import free_port

ADMINS = ("gpu-admins@example.org", "ops.team+gpu@hpc.example.ac.uk")
HOSTILE = "<img src=x onerror=alert(1)>\r\nBcc: thief@evil.example"


def _parsed(mail: EmailMessage) -> EmailMessage:
    got = message_from_bytes(mail.as_bytes(), policy=policy.default)
    assert isinstance(got, EmailMessage)
    return got


def _parts(mail: EmailMessage) -> dict[str, str]:
    return {part.get_content_type(): part.get_content() for part in mail.iter_parts()}


def test_the_mail_is_text_then_html_to_every_admin_with_the_window_in_its_subject() -> None:
    mail = _parsed(review_message(low_util_report(), ADMINS, "slurm-gpu-report@example.org"))
    assert mail.get_content_type() == "multipart/alternative"
    assert [p.get_content_type() for p in mail.iter_parts()] == ["text/plain", "text/html"]
    assert mail["To"] == "gpu-admins@example.org, ops.team+gpu@hpc.example.ac.uk"
    assert mail["From"] == "slurm-gpu-report@example.org"
    # sample_data: 6 flagged of 26 jobs, threshold 25 %, 2026-11-23 08:00 to 11-30 08:00.
    assert mail["Subject"] == ("GPU review: 6 of 26 jobs under 25% busy, "
                               "2026-11-23 08:00 UTC - 2026-11-30 08:00 UTC")
    assert mail["Auto-Submitted"] == "auto-generated" and mail["Message-ID"]
    parts = _parts(mail)
    for jobid, user, *_ in FLAGGED:
        assert jobid in parts["text/plain"] and user in parts["text/plain"]
        assert f">{jobid}<" in parts["text/html"]
    # The charts go inline: the two summary charts and a timeline per flagged job.
    assert parts["text/html"].count("<svg") == 2 + len(FLAGGED)
    assert "\x1b[" not in parts["text/plain"]  # no terminal colours in a mail


def test_a_review_with_nothing_flagged_still_goes_out_and_says_so() -> None:
    mail = _parsed(review_message(empty_low_util_report(), ADMINS[:1], "x"))
    assert mail["Subject"].startswith("GPU review: 0 of 3 jobs under 25% busy")
    assert "No job under the threshold" in _parts(mail)["text/html"]


def test_a_hostile_job_name_is_text_in_both_parts_and_no_header() -> None:
    report = low_util_report()
    report.flagged[0] = replace(report.flagged[0], name=HOSTILE,
                                user="mallory\nBcc: x@evil.example")
    raw = review_message(report, ADMINS, "x").as_bytes()
    mail = _parsed(review_message(report, ADMINS, "x"))
    # No header but ours, at the top or in a part: the user's text is body only.
    assert b"Bcc" not in raw.split(b"\n\n", 1)[0]
    assert [k for k in mail if k.lower() == "bcc"] == []
    for part in mail.iter_parts():
        assert set(part.keys()) <= {"Content-Type", "Content-Transfer-Encoding",
                                    "MIME-Version"}
    parts = _parts(mail)
    assert "<img" not in parts["text/html"] and "&lt;img src=x" in parts["text/html"]
    assert "\nBcc:" not in parts["text/plain"]  # the table's text went through plain()


@pytest.mark.parametrize(("text", "want"), [
    ("gpu-admins@example.org", ("gpu-admins@example.org",)),
    (" a@x.org , b@y.org,,a@x.org ", ("a@x.org", "b@y.org")),
    ("ops.team+gpu@hpc.example.ac.uk", ("ops.team+gpu@hpc.example.ac.uk",)),
])
def test_recipients_are_plain_addresses_each_once(text: str, want: tuple[str, ...]) -> None:
    assert parse_recipients(text) == want


@pytest.mark.parametrize("text", [
    "Admins <a@x.org>", "a@x.org\r\nBcc: b@evil.example", "a@x.org;b@y.org", "a@", "@x.org",
    '"a b"@x.org', "a@x.org b@y.org", "a@-x.org", "a..b@x.org", ",", "", "a@x.org\n",
    "a(comment)@x.org", "a@[127.0.0.1]", "a@x_y.org", "a@" + "x" * 250 + ".org",
])
def test_anything_but_plain_addresses_is_refused(text: str) -> None:
    with pytest.raises(ReportError, match="--report-to") as caught:
        parse_recipients(text)
    assert caught.value.exit_code == 2


def test_more_than_fifty_recipients_is_a_list_s_job() -> None:
    with pytest.raises(ReportError, match="mailing list"):
        parse_recipients(",".join(f"a{i}@x.org" for i in range(51)))


def test_the_file_is_dated_by_the_window_end_and_names_a_cluster_safely() -> None:
    report = low_util_report()  # ends 2026-11-30 08:00 UTC
    assert review_file_name(report) == "low-util-2026-11-30.html"
    assert review_file_name(report, "west") == "low-util-west-2026-11-30.html"
    assert review_file_name(report, "../../etc/x y") == "low-util-.._.._etc_x_y-2026-11-30.html"
    report.window = Window(report.window.start, report.window.end - 8 * 3600 - 1)
    # 2026-11-29 23:59:59 UTC
    assert review_file_name(report) == "low-util-2026-11-29.html"


def _plan(tmp_path: Path, port: int, recipients: tuple[str, ...] = ADMINS) -> ReviewPlan:
    return ReviewPlan(recipients=recipients, server=("127.0.0.1", port),
                      out_dir=tmp_path / "reviews")


def test_the_file_is_written_0640_whole_and_past_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "reviews").mkdir()
    (tmp_path / "reviews" / "low-util-2026-11-30.html").symlink_to(victim)
    assert deliver_review(low_util_report(), _plan(tmp_path, 0, ()), "x", None) == 0
    written = tmp_path / "reviews" / "low-util-2026-11-30.html"
    assert not written.is_symlink() and victim.read_text() == "keep"
    assert stat.S_IMODE(written.stat().st_mode) == 0o640
    text = written.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.endswith("</html>\n")
    assert [p.name for p in (tmp_path / "reviews").iterdir()] == [written.name]  # no temp


def test_a_failed_send_exits_6_and_says_where_the_written_review_is(tmp_path: Path,
                                                                     capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ReportError, match=r"cannot send mail to gpu-admins@example\.org") as caught:
        deliver_review(low_util_report(), _plan(tmp_path, free_port()), "x", "west")
    path = tmp_path / "reviews" / "low-util-west-2026-11-30.html"
    assert caught.value.exit_code == 6
    assert str(caught.value).endswith(f"; the review is in {path}")
    assert path.read_text().startswith("<!DOCTYPE html>")
    assert f"wrote the review (6 flagged jobs) to {path}" in capsys.readouterr().out


def test_an_unwritable_directory_still_lets_the_mail_go_then_fails(tmp_path: Path,
                                                                  smtp_inbox) -> None:  # type: ignore[no-untyped-def]
    url, inbox = smtp_inbox
    (tmp_path / "reviews").write_text("a file, not a directory")
    plan = ReviewPlan(recipients=ADMINS[:1], server=("127.0.0.1", int(url.rsplit(":", 1)[1])),
                      out_dir=tmp_path / "reviews")
    with pytest.raises(ReportError, match="cannot write the review"):
        deliver_review(low_util_report(), plan, "x", None)
    assert len(inbox) == 1


@pytest.mark.parametrize(("args", "said"), [
    (["--report-to", "Admins <a@x.org>"], "bad --report-to address"),
    (["--smtp", "smtp://mail.example.org"], "--smtp is the server for --report-to"),
    (["--out-dir", "/tmp/x", "--smtp", "smtp://m"], "--smtp is the server for --report-to"),
    (["--report-to", "a@x.org", "--smtp", "http://mail"], "bad --smtp 'http://mail'"),
    (["--report-to", "a@x.org", "--smtp", "smtp://mail:99999"], "bad --smtp"),
    (["--report-to", "a@x.org", "--notify", "smtp://m"], "two runs"),
    (["--out-dir", "/tmp/x", "--dry-run"], "two runs"),
    (["--report-to", "a@x.org", "--output", "r.html"], "not --output"),
])
def test_bad_review_flags_fail_before_any_query(args: list[str], said: str, capsys) -> None:  # type: ignore[no-untyped-def]
    # A closed port: were a query made, the error would be a connection's instead.
    code = main(["low-util", "--since", "7d", "--prometheus-url",
                 f"http://127.0.0.1:{free_port()}", *args])
    assert code == 2
    assert said in capsys.readouterr().err
