"""The shipped units for enforce, remediate and the admins' review: systemd accepts
them, enforce's service is a dry run until a site adds --cancel, and the review runs
weekly over the week before."""

from __future__ import annotations

import configparser
import shutil
import subprocess

import pytest

from tests.support import REPO, require

pytestmark = pytest.mark.process

SYSTEMD = REPO / "deploy" / "systemd"
UNITS = ("slurm-gpu-enforce.service", "slurm-gpu-enforce.timer", "slurm-gpu-remediate.service",
         "slurm-gpu-report-review.service", "slurm-gpu-report-review.timer")


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((SYSTEMD / name).read_text())
    return parser


def test_systemd_verifies_the_enforce_remediate_and_review_units() -> None:
    require(shutil.which("systemd-analyze") is not None, "systemd-analyze (Debian's systemd)")
    result = subprocess.run(["systemd-analyze", "verify", *(str(SYSTEMD / u) for u in UNITS)],
                            capture_output=True, text=True, timeout=60, check=False)
    problems = [line for line in result.stderr.splitlines()
                if "slurm-gpu-" in line and "Command /opt/" not in line]
    assert not problems, result.stderr


def test_enforce_runs_as_a_dry_run_from_its_timer() -> None:
    service = _unit("slurm-gpu-enforce.service")
    assert service["Service"]["Type"] == "oneshot"
    assert "--cancel" not in service["Service"]["ExecStart"]
    assert "--policy" in service["Service"]["ExecStart"]
    timer = _unit("slurm-gpu-enforce.timer")
    assert timer["Timer"]["OnUnitActiveSec"] == "5min"
    assert timer["Install"]["WantedBy"] == "timers.target"
    assert "remediate" in _unit("slurm-gpu-remediate.service")["Service"]["ExecStart"]


def test_the_review_runs_weekly_over_the_week_before_without_capabilities() -> None:
    from slurm_gpu_exporter.report.cli.flags import build_parser

    service = _unit("slurm-gpu-report-review.service")["Service"]
    argv = service["ExecStart"].split()
    assert argv[:4] == ["/opt/slurm-gpu-exporter/bin/slurm-gpu-report", "low-util",
                        "--since", "7d"]
    assert argv[4:] == ["$SLURM_GPU_REPORT_REVIEW_ARGS"]  # split at blanks by systemd
    args = build_parser().parse_args([*argv[1:4], "--report-to", "a@example.org"])
    assert args.since == "7d" and args.report_to == "a@example.org"
    assert service["EnvironmentFile"] == "-/etc/default/slurm-gpu-report-review"
    assert service["CapabilityBoundingSet"] == "" and service["ProtectSystem"] == "strict"
    timer = _unit("slurm-gpu-report-review.timer")
    assert timer["Timer"]["OnCalendar"] == "Mon *-*-* 07:00"
    assert timer["Timer"]["Persistent"] == "true"
    assert timer["Install"]["WantedBy"] == "timers.target"
