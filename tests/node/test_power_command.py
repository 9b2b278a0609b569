"""The site's node power command, run for real: stand-in scripts that answer, fail, hang
or print garbage."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from slurm_gpu_exporter.jobs.node_energy import MeasuredParts, NodeEnergySource
from slurm_gpu_exporter.node.hwmon import MeterDown
from slurm_gpu_exporter.node.power_command import PowerCommand, parse_power
from slurm_gpu_exporter.node.source_health import SourceErrors
from tests.support import Clock, wait_until

DCMI = b"""
    Instantaneous power reading:                   312 Watts
    Minimum during sampling period:                 98 Watts
    Maximum during sampling period:                402 Watts
    Average power reading over sample period:      290 Watts
    IPMI timestamp:                           Tue Dec  1 23:55:02 2026
    Sampling period:                          00000005 Seconds.
    Power reading state is:                   activated
"""


def _script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "power"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return [str(path)]


def test_ipmitool_dcmi_and_a_bare_number_parse() -> None:
    assert parse_power(DCMI) == 312.0
    assert parse_power(b"412.5 W\n") == 412.5
    assert parse_power(b"  97\n") == 97.0


@pytest.mark.parametrize("output", [b"", b"-5\n", b"312 Watts\n313 Watts\n", b"nan\n",
                                    b"Instantaneous power reading: unknown\n",
                                    DCMI + b"Instantaneous power reading: 1 Watts\n"])
def test_output_that_is_not_exactly_one_reading_is_refused(output: bytes) -> None:
    with pytest.raises(ValueError):
        parse_power(output)


@pytest.mark.process
def test_a_reading_is_kept_until_it_is_too_old(tmp_path: Path) -> None:
    clock = Clock(0.0)
    command = PowerCommand(_script(tmp_path, "echo '312 Watts'\n"), interval=30.0,
                           timeout=10.0, clock=clock)
    with pytest.raises(MeterDown, match="not answered yet"):
        command.read()
    command.run_once()
    assert command.read() == 312.0
    clock.now = 69.0  # two intervals and the timeout: still the last reading
    assert command.read() == 312.0
    clock.now = 71.0
    with pytest.raises(MeterDown, match="no reading for 70 s"):
        command.read()


@pytest.mark.process
def test_a_failing_command_is_down_with_its_last_words(tmp_path: Path) -> None:
    command = PowerCommand(_script(tmp_path, "echo 'Error: no DCMI' >&2\nexit 3\n"),
                           interval=30.0, timeout=10.0)
    command.run_once()
    with pytest.raises(MeterDown, match="exited with status 3: 'Error: no DCMI'"):
        command.read()


@pytest.mark.process
def test_garbage_output_is_down_not_zero(tmp_path: Path) -> None:
    errors = SourceErrors()
    command = PowerCommand(_script(tmp_path, "echo 'Power: lots'\n"), interval=30.0,
                           timeout=10.0)
    source = NodeEnergySource(command, errors)
    command.run_once()
    part = source.sample(0.0, [], MeasuredParts())
    assert not part.up and part.power_watts is None and part.energy_joules is None
    assert errors.snapshot()["nodepower"] == 1


@pytest.mark.process
def test_a_slow_command_is_killed_with_what_it_started(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    command = PowerCommand(_script(tmp_path, f"sleep 600 &\necho $$ $! > {pids}\nwait\n"),
                           interval=30.0, timeout=2.0)
    command.run_once()
    with pytest.raises(MeterDown, match="no answer within 2 s"):
        command.read()
    # A machine slow enough to reach the timeout before the script wrote its pids has
    # killed it before it started its child: nothing more to look for then.
    for pid in map(int, pids.read_text().split() if pids.exists() else []):
        wait_until(lambda pid=pid: _gone(pid), 10.0, f"process {pid} to end")


@pytest.mark.process
def test_a_missing_command_is_down_with_a_clear_reason(tmp_path: Path) -> None:
    command = PowerCommand([str(tmp_path / "absent")], interval=30.0, timeout=1.0)
    command.run_once()
    with pytest.raises(MeterDown, match="cannot run"):
        command.read()


@pytest.mark.process
def test_the_thread_runs_the_command_and_stops(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    command = PowerCommand(_script(tmp_path, f"echo run >> {runs}\necho 250\n"),
                           interval=3600.0, timeout=10.0)
    command.start()
    try:
        wait_until(lambda: _answered(command), 10.0, "the first reading")
    finally:
        command.stop()
    assert command.read() == 250.0
    # one run per interval: the hour has not passed
    assert runs.read_text().count("run") == 1


def _answered(command: PowerCommand) -> bool:
    try:
        command.read()
    except MeterDown:
        return False
    return True


def _gone(pid: int) -> bool:
    """Ended: no such process, or a zombie nobody has reaped yet."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_the_agent_refuses_an_unbalanced_command_line() -> None:
    from slurm_gpu_exporter.agent.flags import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--node-power.command", "ipmitool 'dcmi"])
    args = build_parser().parse_args(["--node-power.command", "ipmitool dcmi power reading"])
    assert args.node_power_command == ["ipmitool", "dcmi", "power", "reading"]
    assert os.path.basename(args.hwmon_root) == "hwmon"
