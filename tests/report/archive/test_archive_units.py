"""The systemd service and timer that run ``archive``: systemd accepts them, the timer
fires every 15 minutes, and the service's command line is one the report accepts."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_gpu_exporter.report.cli.flags import build_parser
from tests.support import REPO, require

pytestmark = pytest.mark.process

UNITS = REPO / "deploy" / "systemd"
SERVICE = UNITS / "slurm-gpu-report-archive.service"
TIMER = UNITS / "slurm-gpu-report-archive.timer"


def _exec_start() -> list[str]:
    line = re.search(r"^ExecStart=(.*)$", SERVICE.read_text(), re.M)
    assert line is not None
    return line.group(1).split()


def test_systemd_accepts_the_archive_service_and_timer(tmp_path: Path) -> None:
    require(shutil.which("systemd-analyze") is not None,
            "systemd-analyze is missing (Debian: apt-get install systemd)")
    # The unit names the installed venv; here it points at this checkout's.
    binary = Path(sys.executable).parent / "slurm-gpu-report"
    service = tmp_path / SERVICE.name
    service.write_text(SERVICE.read_text().replace(
        "/opt/slurm-gpu-exporter/bin/slurm-gpu-report", str(binary)))
    shutil.copy(TIMER, tmp_path / TIMER.name)
    got = subprocess.run(["systemd-analyze", "verify", str(service), str(tmp_path / TIMER.name)],
                         capture_output=True, text=True, check=False)
    assert got.returncode == 0 and not got.stderr.strip(), got.stderr


def test_the_timer_fires_every_15_minutes_over_2_hour_windows() -> None:
    require(shutil.which("systemd-analyze") is not None,
            "systemd-analyze is missing (Debian: apt-get install systemd)")
    calendar = re.search(r"^OnCalendar=(.*)$", TIMER.read_text(), re.M)
    assert calendar is not None
    got = subprocess.run(["systemd-analyze", "calendar", "--iterations=3",
                          "--base-time=2026-12-01 10:01:00 UTC", calendar.group(1)],
                         capture_output=True, text=True, check=True)
    assert re.findall(r"\d\d:\d\d:00", got.stdout) == ["10:15:00", "10:30:00", "10:45:00"]
    argv = _exec_start()
    assert argv[0] == "/opt/slurm-gpu-exporter/bin/slurm-gpu-report"
    args = build_parser().parse_args([a for a in argv[1:] if not a.startswith("$")])
    assert (args.command, args.since) == ("archive", "2h")
