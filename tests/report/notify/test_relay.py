"""Mail through a site's relay (``--smtp-starttls``, ``--smtp-ca-file``, ``--smtp-user``,
``--smtp-password-file``): a real SMTP server (aiosmtpd, in this process) that requires
STARTTLS and AUTH, its certificate self-signed here and trusted only through the CA file.
The review and the users' notices get through with the right password; a wrong one is
one line and exit 6 that never shows it; a server without STARTTLS gets no credentials;
a password file that cannot be read is said before any query."""

from __future__ import annotations

import logging
from email import message_from_bytes
from email.message import EmailMessage
from pathlib import Path

import pytest

from slurm_gpu_exporter.report.cli.main import main
from slurm_gpu_exporter.report.cli.review import ReviewPlan, deliver_review
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.rules import load_config
from slurm_gpu_exporter.report.notify.notices import NotifyState, messages
from slurm_gpu_exporter.report.notify.relay import RelayLogin, read_password_file, relay_login
from slurm_gpu_exporter.report.notify.send import send, send_mail
from tests.report.notify.relay_server import (
    ADMIN,
    PASSWORD,
    USER,
    Relay,
    password_file,
    self_signed,
)
from tests.report.sample_data import END, low_util_report
from tests.support import free_port


def _review(capsys: pytest.CaptureFixture[str], prometheus: str, relay: Relay,
            password_file: Path, *more: str) -> tuple[int, str, str]:
    code = main(["low-util", "--since", "7d", "--prometheus-url", prometheus,
                 "--report-to", ADMIN, "--smtp", relay.url, "--smtp-starttls",
                 "--smtp-ca-file", str(relay.ca_file), "--smtp-user", USER,
                 "--smtp-password-file", str(password_file), *more])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_review_reaches_a_relay_that_requires_starttls_and_auth(
        relay: Relay, prometheus: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _review(capsys, prometheus, relay, password_file(tmp_path))
    assert code == 0, err
    assert f"sent the review (0 flagged jobs) to {ADMIN}" in out
    assert relay.logins == [(USER, True)]
    assert relay.sessions == [(True, True)]  # over TLS, logged in
    assert message_from_bytes(relay.inbox[0])["To"] == ADMIN


def test_users_notices_reach_the_relay_with_starttls_and_auth(relay: Relay,
                                                              tmp_path: Path) -> None:
    login = relay_login(True, str(relay.ca_file), USER, str(password_file(tmp_path)))
    todo = messages(low_util_report(), load_config(None), NotifyState(tmp_path / "s.json"),
                    END, "{user}@example.org")
    for message, _ in todo:
        send(message, relay.url, "gpu-report@example.org", login)
    assert len(relay.inbox) == len(todo) and relay.sessions == [(True, True)] * len(todo)


def test_a_wrong_password_is_one_line_and_exit_6_that_never_shows_it(
        relay: Relay, prometheus: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    wrong = "not-the-Password-42"
    caplog.set_level(logging.DEBUG)
    code, out, err = _review(capsys, prometheus, relay, password_file(tmp_path, wrong + "\n"),
                             "--verbose")
    assert code == 6, err
    assert err.count("\n") == 1 and err.startswith("slurm-gpu-report: "), err
    assert f"refused the login of '{USER}'" in err and "535" in err, err
    assert "--smtp-user and the password file" in err
    for text in (out, err, caplog.text):
        assert wrong not in text and PASSWORD not in text
    assert relay.logins and not any(ok for _, ok in relay.logins) and relay.inbox == []


@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")
def test_a_server_without_starttls_gets_neither_the_password_nor_the_mail(
        clear_relay: Relay, tmp_path: Path) -> None:
    plan = ReviewPlan(recipients=(ADMIN,), server=("127.0.0.1", clear_relay.port),
                      out_dir=None,
                      login=relay_login(True, None, USER, str(password_file(tmp_path))))
    with pytest.raises(ReportError, match="does not offer STARTTLS") as caught:
        deliver_review(low_util_report(), plan, "x", None)
    assert caught.value.exit_code == 6
    assert PASSWORD not in str(caught.value)
    assert clear_relay.logins == [] and clear_relay.inbox == []  # refused before AUTH


@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")
def test_a_login_built_without_starttls_is_never_sent_in_clear(clear_relay: Relay) -> None:
    # Past the flags' check (relay_login), the sender still refuses on its own.
    login = RelayLogin(starttls=False, user=USER, password=PASSWORD)
    with pytest.raises(ReportError, match=r"not logging in .* not encrypted") as caught:
        send_mail(EmailMessage(), ("127.0.0.1", clear_relay.port), (ADMIN,), login)
    assert caught.value.exit_code == 6
    assert clear_relay.logins == [] and clear_relay.inbox == []


def test_a_certificate_the_ca_file_does_not_vouch_for_gets_no_password(
        relay: Relay, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    other_ca, _ = self_signed(other)
    plan = ReviewPlan(recipients=(ADMIN,), server=("127.0.0.1", relay.port), out_dir=None,
                      login=relay_login(True, str(other_ca), USER,
                                        str(password_file(tmp_path))))
    with pytest.raises(ReportError, match="certificate does not verify") as caught:
        deliver_review(low_util_report(), plan, "x", None)
    assert caught.value.exit_code == 6
    assert relay.logins == [] and relay.inbox == []


def test_a_missing_password_file_is_said_before_any_query(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-password"
    # A closed port: were a query made, the error would be a connection's instead.
    code = main(["low-util", "--since", "7d", "--prometheus-url",
                 f"http://127.0.0.1:{free_port()}", "--report-to", ADMIN, "--smtp",
                 "smtp://127.0.0.1:587", "--smtp-starttls", "--smtp-user", USER,
                 "--smtp-password-file", str(missing)])
    err = capsys.readouterr().err
    assert code == 2
    assert err == (f"slurm-gpu-report: cannot read the SMTP password file {missing}: No such "
                   "file or directory; give --smtp-password-file a file this user can "
                   "read\n")


@pytest.mark.parametrize(("text", "want"), [
    (PASSWORD + "\n", PASSWORD), (PASSWORD, PASSWORD), (PASSWORD + "\r\n", PASSWORD),
    (" pad \n", " pad "),  # only the newline goes
])
def test_the_password_is_the_files_text_less_one_trailing_newline(
        tmp_path: Path, text: str, want: str) -> None:
    assert read_password_file(str(password_file(tmp_path, text))) == want


@pytest.mark.parametrize("text", ["", "\n", "two\nlines\n", "p\x00ss\n", "p\u00e4ss\n"])
def test_a_password_file_smtp_cannot_carry_is_refused_without_showing_it(
        tmp_path: Path, text: str) -> None:
    path = password_file(tmp_path, text)
    with pytest.raises(ReportError, match=f"the SMTP password file {path}") as caught:
        read_password_file(str(path))
    assert caught.value.exit_code == 2
    for part in ("two", "lines", "p\x00ss", "p\u00e4ss"):
        assert part not in str(caught.value)


@pytest.mark.parametrize(("args", "said"), [
    (["--smtp-user", USER, "--smtp-password-file", "/x"], "add --smtp-starttls"),
    (["--smtp-starttls", "--smtp-user", USER], "needs both --smtp-user and"),
    (["--smtp-starttls", "--smtp-password-file", "/x"], "needs both --smtp-user and"),
    (["--smtp-ca-file", "/x"], "add --smtp-starttls"),
    (["--smtp-starttls", "--smtp-ca-file", "/nonexistent/ca.pem"],
     "cannot use --smtp-ca-file /nonexistent/ca.pem"),
])
def test_a_login_that_could_go_in_clear_or_unused_is_refused(
        args: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["low-util", "--since", "7d", "--prometheus-url",
                 f"http://127.0.0.1:{free_port()}", "--report-to", ADMIN, *args])
    assert code == 2
    assert said in capsys.readouterr().err


def test_login_flags_without_smtp_mail_are_refused(capsys: pytest.CaptureFixture[str]
                                                   ) -> None:
    for where in ([], ["--notify", "https://hooks.example.org/x"]):
        code = main(["low-util", "--since", "7d", "--prometheus-url",
                     f"http://127.0.0.1:{free_port()}", "--smtp-starttls", *where])
        assert code == 2
        assert "--smtp-starttls is for mail through an SMTP server" in capsys.readouterr().err


def test_the_password_is_not_in_the_logins_repr(tmp_path: Path) -> None:
    login = relay_login(True, None, USER, str(password_file(tmp_path)))
    shown = repr(login)
    assert PASSWORD not in shown and USER in shown
