"""The relay's login written once in a ``[notify]`` section (``smtp_*`` keys of the
report's ``--config`` and of enforce's ``--policy``), each ``--smtp-*`` flag winning over
its key; checked against the real relay of ``relay_server`` (STARTTLS and AUTH
required)."""

from __future__ import annotations

import email
from pathlib import Path

import pytest

from slurm_gpu_exporter.report.cli.main import main
from slurm_gpu_exporter.report.enforce.decisions import Decision
from slurm_gpu_exporter.report.enforce.policy import parse_policy
from slurm_gpu_exporter.report.enforce.run import EnforceOptions, act_all
from slurm_gpu_exporter.report.enforce.state import EnforceState
from slurm_gpu_exporter.report.notify.relay import relay_login
from slurm_gpu_exporter.report.prometheus.queries import Filters
from tests.report.notify.relay_server import ADMIN, USER, Relay, password_file
from tests.support import free_port

NOW = 1_800_000_000.0


def _notify_section(relay: Relay, password: Path, user: str = USER) -> str:
    return (f'[notify]\nsmtp_starttls = true\nsmtp_ca_file = "{relay.ca_file}"\n'
            f'smtp_user = "{user}"\nsmtp_password_file = "{password}"\n')


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "report.toml"
    path.write_text(text)
    return path


def _review(prometheus: str, relay: Relay, config: Path, *flags: str) -> int:
    return main(["low-util", "--since", "7d", "--prometheus-url", prometheus,
                 "--report-to", ADMIN, "--smtp", relay.url, "--config", str(config), *flags])


def test_the_review_logs_in_with_the_configs_keys_alone(
        relay: Relay, prometheus: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, _notify_section(relay, password_file(tmp_path)))
    assert _review(prometheus, relay, config) == 0, capsys.readouterr().err
    assert relay.logins == [(USER, True)] and relay.sessions == [(True, True)]


def test_each_flag_wins_over_its_key(relay: Relay, prometheus: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    right = password_file(tmp_path)
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not it\n")
    config = _config(tmp_path, _notify_section(relay, wrong, user="someone-else"))
    assert _review(prometheus, relay, config, "--smtp-user", USER,
                   "--smtp-password-file", str(right)) == 0, capsys.readouterr().err
    assert relay.logins == [(USER, True)]
    # and the key stands where its flag is not given: the wrong password, exit 6
    assert _review(prometheus, relay, config, "--smtp-user", USER) == 6
    assert relay.logins[-1] == (USER, False) and len(relay.inbox) == 1


def test_keys_do_not_apply_to_a_run_that_mails_nothing(
        prometheus: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A site's one config serves every run: a report to stdout reads no password file."""
    config = _config(tmp_path, '[notify]\nsmtp_starttls = true\nsmtp_user = "u"\n'
                               f'smtp_password_file = "{tmp_path / "missing"}"\n')
    code = main(["low-util", "--since", "7d", "--prometheus-url", prometheus,
                 "--config", str(config)])
    assert code == 0, capsys.readouterr().err


@pytest.mark.parametrize(("text", "said"), [
    ('smtp_starttls = "yes"', "notify.smtp_starttls must be a boolean"),
    ("smtp_user = 7", "notify.smtp_user must be a string"),
])
def test_a_key_of_the_wrong_type_is_refused_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, said: str) -> None:
    config = _config(tmp_path, f"[notify]\n{text}\n")
    code = main(["low-util", "--since", "7d", "--prometheus-url",
                 f"http://127.0.0.1:{free_port()}", "--config", str(config)])
    assert code == 2 and said in capsys.readouterr().err


def _warning(jobid: str) -> Decision:
    return Decision(jobid=jobid, user="ann", account="lab", partition="gpu", name="train",
                    gpus=1, nodes=("gpu01",), idle_for_s=3600.0, action="warn",
                    reason="idle for 1h: warning 1 of 2", warning=1, cancel_at=NOW + 3600)


def test_enforce_warnings_reach_a_relay_that_requires_starttls_and_auth(
        relay: Relay, tmp_path: Path) -> None:
    login = relay_login(True, str(relay.ca_file), USER, str(password_file(tmp_path)))
    options = EnforceOptions(policy=parse_policy(""), cancel=True,
                             state_path=tmp_path / "enforce.json", filters=Filters(),
                             notify=relay.url, mail_to="{user}@example.org", login=login)
    assert act_all([_warning("31")], EnforceState(options.state_path), options, NOW) == set()
    assert relay.logins == [(USER, True)] and relay.sessions == [(True, True)]
    assert email.message_from_bytes(relay.inbox[0])["To"] == "ann@example.org"


def _enforce(tmp_path: Path, policy: str, *flags: str) -> int:
    path = tmp_path / "policy.toml"
    path.write_text(policy)
    # A closed port: were a query made, the error would be a connection's instead.
    return main(["enforce", "--policy", str(path), "--prometheus-url",
                 f"http://127.0.0.1:{free_port()}", *flags])


def test_enforce_reads_the_policys_login_before_any_query(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-password"
    policy = ('[notify]\nsmtp_starttls = true\nsmtp_user = "u"\n'
              f'smtp_password_file = "{missing}"\n')
    assert _enforce(tmp_path, policy, "--cancel", "--notify", "smtp://127.0.0.1:587") == 2
    assert f"cannot read the SMTP password file {missing}" in capsys.readouterr().err


def test_enforce_login_flags_without_smtp_mail_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = _enforce(tmp_path, "", "--cancel", "--notify", "https://hooks.example.org/x",
                    "--smtp-starttls")
    assert code == 2
    assert "--smtp-starttls is for mail through an SMTP server" in capsys.readouterr().err
