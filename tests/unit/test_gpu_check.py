"""The pure parts of scripts/gpu_check.py (the check itself needs a real NVIDIA GPU)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_expected_sm_activity_is_duty_times_the_share_of_sms_held(gpu_check: ModuleType) -> None:
    assert gpu_check.expected_sm_active(1.0, 33, 132) == pytest.approx(0.25)
    assert gpu_check.expected_sm_active(0.3, 1, 132) == pytest.approx(0.3 / 132)
    assert gpu_check.expected_sm_active(1.0, 500, 132) == 1.0  # more blocks than SMs
    assert gpu_check.expected_sm_active(1.0, 4, 0) == 0.0


def _scrape(allocated: float, busy: float, sm: float | None) -> dict:  # type: ignore[type-arg]
    labels = {"jobid": "990001", "user": "gpucheck", "gpu": "0", "uuid": "GPU-x"}
    out = {"slurm_job_gpu_allocated_seconds_total": [(labels, allocated)],
           "slurm_job_gpu_busy_seconds_total": [(labels, busy)]}
    if sm is not None:
        out["slurm_job_gpu_sm_active_seconds_total"] = [(labels, sm)]
    return out


def test_window_ratios_divide_the_increases_by_allocated_and_leave_gpm_absent_without_it(
    gpu_check: ModuleType,
) -> None:
    labels = {"jobid": "990001", "gpu": "0"}
    got = gpu_check.window_ratios(_scrape(10, 5, 1), _scrape(70, 65, 16), labels)
    assert got["allocated"] == 60 and got["busy"] == 1.0
    assert got["sm_active"] == pytest.approx(0.25)
    assert got["tensor_active"] is None
    without = gpu_check.window_ratios(_scrape(10, 5, None), _scrape(70, 23, None), labels)
    assert without["busy"] == pytest.approx(0.3) and without["sm_active"] is None
    rows = dict(gpu_check.load_rows("spin", without, 0.3, 0.0023))
    assert rows["spin: busy ratio (agent)"] == "0.3000"
    assert rows["spin: SM active ratio (agent)"] == "absent"
    assert rows["spin: SM active ratio (expected)"] == "0.0023"


@pytest.mark.process
def test_script_help_runs_without_a_gpu() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True,
                         text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    assert "--blocks" in out.stdout
