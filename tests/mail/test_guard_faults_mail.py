"""slurm-gpu-mail's delivery on plain values: with no summary to add (a start mail, a
config that does not parse), the mailer is handed Slurm's own body and arguments
unchanged; a control character in the subject never reaches it. The mailer is stood
in for by a function that records what it is given (tests/mail/test_wrapper.py runs the
console script with a real one)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu_exporter.mail import cli

ARGS = ["-s", "Slurm Job_id=42 Name=x Began, Queued time 00:00:01", "alice"]
BODY = b"Slurm's own text\nsecond line\n"


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[tuple]]:  # type: ignore[type-arg]
    """What the mailer was handed: (mailer, arguments, message) per call."""
    calls: list[tuple] = []  # type: ignore[type-arg]
    monkeypatch.setattr(cli, "_slurms_body", lambda: BODY)
    monkeypatch.setattr(cli, "deliver", lambda mailer, argv, message, _timeout:
                        calls.append((mailer, list(argv), message)) or (0, None))
    monkeypatch.setattr(cli, "SYSLOG", str(tmp_path / "no-syslog"))
    for name in list(cli.os.environ):
        if name.startswith("SLURM_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    before = list(cli.log.handlers)
    yield calls
    for handler in cli.log.handlers[len(before):]:
        cli.log.removeHandler(handler)
        handler.close()


def test_a_mail_without_a_summary_goes_with_slurms_body(
        handed: list[tuple], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # type: ignore[type-arg]
    config = tmp_path / "mail.toml"
    config.write_text('mailer = "/usr/bin/stand-in"\n')
    monkeypatch.setenv("SLURM_GPU_MAIL_CONFIG", str(config))
    monkeypatch.setenv("SLURM_JOB_MAIL_TYPE", "Began")  # no summary for a start mail
    assert cli.main(list(ARGS)) == 0
    assert handed == [("/usr/bin/stand-in", ARGS, BODY)]


def test_a_config_that_does_not_parse_still_sends_slurms_body(
        handed: list[tuple], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # type: ignore[type-arg]
    config = tmp_path / "mail.toml"
    config.write_text("mailer = [\n")
    monkeypatch.setenv("SLURM_GPU_MAIL_CONFIG", str(config))
    monkeypatch.setenv("SLURM_JOB_MAIL_TYPE", "Ended")
    monkeypatch.setenv("SLURM_JOB_STATE", "COMPLETED")
    assert cli.main(list(ARGS)) == 0
    ((_, argv, message),) = handed
    assert (argv, message) == (ARGS, BODY)


def test_a_newline_in_the_subject_is_a_space_for_the_mailer() -> None:
    subject = "Slurm Job_id=42 Name=x\nBcc: all@example.org\r\x1b[31m Ended"
    assert cli.inert_arguments(["-s", subject, "alice"]) == [
        "-s", "Slurm Job_id=42 Name=x Bcc: all@example.org  [31m Ended", "alice"]
