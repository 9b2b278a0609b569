"""``slurm-gpu-proxy``'s flags as docs/proxy.md lists them (names, defaults, what each
takes), its ``--help`` against a checked-in file, the range checks of the limits and
the start-up errors ``main`` reports before it serves anything.

Regenerate the help file after an intended change with
``UPDATE_GOLDEN=1 .venv/bin/pytest tests/proxy/test_proxy_flags.py`` and review the diff.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from slurm_gpu_exporter.proxy import cli
from slurm_gpu_exporter.proxy.cli import build_parser, fair_limits, main
from slurm_gpu_exporter.proxy.fairness import FairLimits

ROOT = Path(__file__).resolve().parents[2]
HELP = Path(__file__).parent / "golden" / "help.txt"


def test_the_help_matches_the_checked_in_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    produced = build_parser().format_help()
    if os.environ.get("UPDATE_GOLDEN") == "1":
        HELP.write_text(produced)
    assert produced == HELP.read_text()


def _documented_flags() -> dict[str, str]:
    """docs/proxy.md's flag table: flag -> its description."""
    rows = re.findall(r"^\| `(--[a-z.-]+)[^`]*` \| (.*) \|$",
                      (ROOT / "docs" / "proxy.md").read_text(), re.M)
    return dict(rows)


def test_every_documented_flag_is_a_flag_and_every_flag_is_documented() -> None:
    documented = set(_documented_flags())
    flags = {s for a in build_parser()._actions for s in a.option_strings
             if s.startswith("--")} - {"--help", "--version"}
    assert documented == flags


def test_the_defaults_are_the_documented_ones() -> None:
    args = build_parser().parse_args([])
    assert (args.prometheus_url, args.listen, args.web_config, args.config) == (
        None, None, None, None)
    assert (args.admin, args.public_metric, args.munge_audience) == ([], [], [])
    assert args.munge is False and args.munge_socket == Path("/run/munge/munge.socket.2")
    assert (args.archive_url, args.archive_timeout) == (None, 10.0)
    assert (args.max_connections, args.max_per_client) == (1024, 512)
    assert (args.checks_per_user, args.upstream_per_user, args.waiting_per_user) == (1, 16, 64)
    assert (args.wait_seconds, args.backoff_max, args.upstream_body_bytes) == (
        5.0, 60.0, 64 * 1024 * 1024)
    assert args.log_level == "info"
    # each documented "(default N)" is the parser's
    for flag, text in _documented_flags().items():
        match = re.search(r"default (\d+)", text)
        if match:
            dest = next(a.dest for a in build_parser()._actions if flag in a.option_strings)
            assert getattr(args, dest) == int(match.group(1)), flag


def test_a_full_command_line_sets_every_flag() -> None:
    args = build_parser().parse_args([
        "--prometheus-url", "http://mimir/prometheus", "--web.listen-address", ":1",
        "--web.listen-address", "[::1]:2", "--web.config.file", "/etc/w.yml",
        "--admin", "root", "hpcadmin", "--admin", "ops", "--public-metric", "a:b", "c",
        "--config", "/etc/p.yml", "--munge", "--munge.socket", "/run/m.sock",
        "--munge.audience", "https://a:1", "--munge.audience", "https://b:2",
        "--archive.url", "sqlite:////srv/a.db", "--archive.timeout", "2.5",
        "--web.max-connections", "10", "--web.max-connections-per-client", "0",
        "--limits.checks-per-user", "2", "--limits.upstream-per-user", "3",
        "--limits.waiting-per-user", "4", "--limits.wait", "0.5", "--limits.backoff-max",
        "7.5", "--limits.upstream-body-bytes", "1000", "--log.level", "debug"])
    assert args.prometheus_url == "http://mimir/prometheus"
    assert args.listen == [":1", "[::1]:2"]
    assert args.web_config == Path("/etc/w.yml") and args.config == Path("/etc/p.yml")
    assert args.admin == ["root", "hpcadmin", "ops"] and args.public_metric == ["a:b", "c"]
    assert args.munge is True and args.munge_socket == Path("/run/m.sock")
    assert args.munge_audience == ["https://a:1", "https://b:2"]
    assert (args.archive_url, args.archive_timeout) == ("sqlite:////srv/a.db", 2.5)
    assert (args.max_connections, args.max_per_client) == (10, 0)
    assert fair_limits(args) == FairLimits(
        checks_per_user=2, upstream_per_user=3, waiting_per_user=4, wait_seconds=0.5,
        backoff_max_seconds=7.5, upstream_body_bytes=1000)
    assert args.log_level == "debug"


def test_a_log_level_outside_the_four_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--log.level", "trace"])
    assert "invalid choice: 'trace'" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "message"), [
    (["--limits.checks-per-user", "0"], "--limits.checks-per-user must be 1 or more"),
    (["--limits.upstream-per-user", "0"], "--limits.upstream-per-user must be 1 or more"),
    (["--limits.upstream-body-bytes", "0"], "--limits.upstream-body-bytes must be 1 or more"),
    (["--limits.waiting-per-user", "-1"], "--limits.waiting-per-user must be 0 or more"),
    (["--limits.wait", "-0.5"], "--limits.wait must be 0 or more"),
    (["--limits.wait", "nan"], "--limits.wait must be 0 or more"),
    (["--limits.backoff-max", "-1"], "--limits.backoff-max must be 0 or more"),
    (["--web.max-connections", "1"], "--web.max-connections must be 2 or more"),
    (["--web.max-connections-per-client", "-1"],
     "--web.max-connections-per-client must be 0 or more"),
])
def test_each_limit_out_of_range_is_named(flags: list[str], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        fair_limits(build_parser().parse_args(flags))
    assert str(caught.value) == message


def test_the_lowest_limits_in_range_are_taken() -> None:
    args = build_parser().parse_args([
        "--limits.checks-per-user", "1", "--limits.upstream-per-user", "1",
        "--limits.upstream-body-bytes", "1", "--limits.waiting-per-user", "0",
        "--limits.wait", "0", "--limits.backoff-max", "0", "--web.max-connections", "2",
        "--web.max-connections-per-client", "0"])
    assert fair_limits(args) == FairLimits(
        checks_per_user=1, upstream_per_user=1, waiting_per_user=0, wait_seconds=0.0,
        backoff_max_seconds=0.0, upstream_body_bytes=1)


def _signed_header(config: Path) -> None:
    """A config that takes Grafana's user header, proven by a shared secret."""
    (config.parent / "secret").write_text("0123456789abcdef0123\n")
    config.write_text("user_header:\n  name: X-Grafana-User\n"
                      "  secret_header: X-Proxy-Secret\n  secret_file: secret\n")


@pytest.fixture
def start_up(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """main with the logging setup and the server replaced: what it would serve."""
    served: list[tuple] = []
    monkeypatch.setattr(cli, "setup_logging", lambda *a, **k: None)

    async def serve(*args: object) -> int:
        served.append(args)
        return 0

    monkeypatch.setattr(cli, "serve", serve)
    return served


def test_main_refuses_a_proxy_nobody_could_sign_in_to(
        start_up: list[tuple], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--prometheus-url", "http://127.0.0.1:9090"]) == 2
    assert capsys.readouterr().err == (
        "slurm-gpu-proxy: nobody could sign in: add basic_auth_users to --web.config.file, "
        "a user_header to --config, or --munge\n")
    assert start_up == []


def test_main_names_a_limit_out_of_range(
        start_up: list[tuple], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--prometheus-url", "http://127.0.0.1:9090", "--limits.wait", "-1"]) == 2
    assert capsys.readouterr().err == "slurm-gpu-proxy: --limits.wait must be 0 or more\n"


def test_main_wants_munge_for_a_munge_audience(
        start_up: list[tuple], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--prometheus-url", "http://127.0.0.1:9090",
                 "--munge.audience", "https://proxy.example:9818"]) == 2
    assert capsys.readouterr().err == "slurm-gpu-proxy: --munge.audience needs --munge\n"


def test_main_refuses_a_listen_address_it_cannot_read(
        start_up: list[tuple], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--prometheus-url", "http://127.0.0.1:9090",
                 "--web.listen-address", "nowhere"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slurm-gpu-proxy: ") and "nowhere" in err


def test_main_serves_what_the_flags_and_config_say(
        start_up: list[tuple], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "proxy.yml"
    _signed_header(config)
    monkeypatch.setattr(cli.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert main(["--prometheus-url", "http://127.0.0.1:9090", "--config", str(config),
                 "--admin", "root", "--web.listen-address", "127.0.0.1:9818",
                 "--munge", "--munge.audience", "https://proxy.example:9818",
                 "--limits.checks-per-user", "2", "--web.max-connections", "64",
                 "--web.max-connections-per-client", "8"]) == 0
    [(config_, web_config, addresses, socket, archive, audiences, limits, most, per)] = start_up
    assert config_.prometheus_url == "http://127.0.0.1:9090" and "root" in config_.admins
    assert addresses == ["127.0.0.1:9818"] and socket == Path("/run/munge/munge.socket.2")
    assert archive is None and audiences == frozenset({"https://proxy.example:9818"})
    assert limits.checks_per_user == 2 and (most, per) == (64, 8)
    assert not web_config.users


def test_main_without_munge_serves_no_munge_socket(
        start_up: list[tuple], tmp_path: Path) -> None:
    config = tmp_path / "proxy.yml"
    _signed_header(config)
    assert main(["--prometheus-url", "http://127.0.0.1:9090", "--config", str(config)]) == 0
    [(_, _, addresses, socket, _, audiences, limits, most, per)] = start_up
    assert addresses == [":9818"] and socket is None and audiences == frozenset()
    assert limits == FairLimits() and (most, per) == (1024, 512)


def test_main_wants_unmunge_for_munge(start_up: list[tuple], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli.shutil, "which", lambda name: None)
    assert main(["--prometheus-url", "http://127.0.0.1:9090", "--munge"]) == 2
    assert capsys.readouterr().err == (
        "slurm-gpu-proxy: --munge needs unmunge; install munge (Debian: apt-get install "
        "munge)\n")
