"""The pure parts of scripts/gpu_check.py (the check itself needs a real NVIDIA GPU)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import ModuleType

import pytest

from tests.support import REPO

SCRIPT = REPO / "scripts" / "gpu_check.py"


def _load(name: str) -> ModuleType:
    # gpu_shared imports gpu_check by name, as it does beside it in scripts/.
    spec = importlib.util.spec_from_file_location(name, SCRIPT.with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    return _load("gpu_check")


@pytest.fixture(scope="module")
def gpu_shared(gpu_check: ModuleType) -> ModuleType:
    return _load("gpu_shared")


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
    assert "--blocks" in out.stdout and "--shared" in out.stdout


@pytest.mark.process
def test_shared_check_refuses_a_duty_whose_bursts_would_overlap() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--shared", "--duty", "0.6"],
                         capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 2 and "at most 0.5" in out.stderr, out.stderr


def test_a_phased_load_starts_at_its_phase_of_the_next_period(gpu_check: ModuleType) -> None:
    assert gpu_check.first_start(100.3, 2.0, None) == 100.3  # no phase: at once
    assert gpu_check.first_start(100.3, 2.0, 0.0) == 102.0
    assert gpu_check.first_start(100.3, 2.0, 0.5) == 101.0
    assert gpu_check.first_start(101.5, 2.0, 0.5) == 103.0  # its phase is past: the next
    # Two loads, half a period apart, whenever each process starts.
    a, b = gpu_check.first_start(7.9, 2.0, 0.0), gpu_check.first_start(8.2, 2.0, 0.5)
    assert (b - a) % 2.0 == pytest.approx(1.0)


def test_shared_check_holds_each_job_to_its_duty_and_adds_up_the_split(
    gpu_shared: ModuleType,
) -> None:
    tolerance = gpu_shared.shared_tolerance(0.3, 2.0, 60.0, 1 / 6)
    assert tolerance == pytest.approx(0.005 + 0.007 + 0.0039 + 0.02, abs=1e-3)
    jobs = {"A": {"busy": 0.31, "allocated": 60.0}, "B": {"busy": 0.29, "allocated": 60.0}}
    rows, ok = gpu_shared.shared_rows(jobs, 0.3, tolerance, 36.1, 60.0)
    table = dict(rows)
    assert ok and table["job A: busy error, percentage points"] == "+1.00"
    assert table["jobs' busy seconds, together"] == "36.00"
    assert table["GPU's busy seconds"] == "36.10"
    # One job given the other's share too (the split failed): the check fails.
    jobs["A"]["busy"], jobs["B"]["busy"] = 0.6, 0.0
    assert not gpu_shared.shared_rows(jobs, 0.3, tolerance, 36.0, 60.0)[1]
    # A job without series fails it too.
    assert not gpu_shared.shared_rows({"A": {"busy": None, "allocated": None}}, 0.3,
                                      tolerance, None, 60.0)[1]
