"""The agent's command line: help text and start-up errors as a user meets them."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_gpu_exporter.agent.flags import build_parser

AGENT = Path(sys.executable).parent / "slurm-gpu-exporter"


def _help_of(flag: str) -> str:
    """The help text of one flag, joined into one line."""
    text = build_parser().format_help()
    block = re.search(rf"^  {re.escape(flag)}\b.*?(?=^  -|\Z)", text, re.M | re.S)
    assert block, flag
    return " ".join(block.group(0).split())


def test_help_gives_each_default_once_and_no_placeholder_defaults() -> None:
    listen = _help_of("--web.listen-address")
    assert listen.count("default") == 1 and ":9817" in listen
    assert "None" not in build_parser().format_help()
    assert "(default: info)" in _help_of("--log.level")
    assert "debug" in _help_of("--log.level")
    assert "default" not in _help_of("--simulate")


@pytest.mark.process
def test_an_invalid_web_config_stops_the_agent_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "web.yml"
    bad.write_text("basic_auth_users: [unclosed\n")
    result = subprocess.run([str(AGENT), "--web.config.file", str(bad)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(bad) in lines[0] and "line 2, column 1" in lines[0]
    assert "level=ERROR" in lines[0]


@pytest.mark.process
def test_a_busy_address_stops_the_agent_with_one_line_naming_it(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        result = subprocess.run([str(AGENT), "--simulate", "--web.listen-address", address],
                                capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "level=ERROR" in line]
    assert len(errors) == 1, result.stderr
    assert f"cannot listen on {address}: Address already in use" in errors[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("flag", ["--cgroup-grace", "--job-linger", "--sample-interval",
                                  "--web.config.reload-interval", "--web.header-timeout"])
@pytest.mark.parametrize("value", ["-1", "abc", "nan", "inf"])
def test_a_bad_number_of_seconds_is_refused_with_the_flag_named(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([f"{flag}={value}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and value in err, err


def test_zero_seconds_is_refused_where_it_makes_no_sense() -> None:
    args = build_parser().parse_args(["--cgroup-grace=0", "--job-linger=0"])
    assert (args.cgroup_grace, args.job_linger) == (0.0, 0.0)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--sample-interval=0"])


def test_without_a_web_config_file_the_watcher_wakes_only_on_sighup() -> None:
    import asyncio

    from slurm_gpu_exporter.web.reload import LiveWebConfig, watch_web_config

    config = LiveWebConfig(None)
    checks: list[int] = []
    config.check = lambda: bool(checks.append(1))  # type: ignore[method-assign]

    async def run() -> None:
        wake = asyncio.Event()
        watcher = asyncio.create_task(watch_web_config(config, 0.05, wake))
        await asyncio.sleep(0.4)
        assert checks == []  # eight intervals: no executor thread started for nothing
        wake.set()
        await asyncio.sleep(0.2)
        assert checks == [1]
        watcher.cancel()

    asyncio.run(run())
