"""The proxy's systemd unit: it runs the installed entry point, hardened."""

from __future__ import annotations

import shutil
import subprocess
import tomllib

import pytest

from tests.support import REPO, require
from tests.support.daemons import DEPLOY

pytestmark = pytest.mark.process

UNIT = DEPLOY / "systemd" / "slurm-gpu-proxy.service"


def test_the_unit_starts_the_entry_point_with_its_credentials() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["slurm-gpu-proxy"] == "slurm_gpu_exporter.proxy.cli:main"
    (exec_start,) = [line for line in UNIT.read_text().splitlines()
                     if line.startswith("ExecStart=")]
    assert exec_start.startswith("ExecStart=/opt/slurm-gpu-exporter/bin/slurm-gpu-proxy ")
    assert "--web.config.file %d/web.yml" in exec_start and "--config %d/proxy.yml" in exec_start


def test_systemd_rates_the_unit_well_hardened() -> None:
    require(shutil.which("systemd-analyze") is not None,
            "systemd-analyze (Debian package systemd) is not installed")
    # 2 of 10 at most: no privileges at all (the agent's unit, which needs root, is at 5).
    result = subprocess.run(["systemd-analyze", "security", "--offline=true",
                             "--threshold=20", str(UNIT)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
