"""Emissions from a carbon-intensity series a site fills, against a real Prometheus:
a job's energy counters and the factor series are backfilled (promtool), and `job`
integrates each step's energy times the factor then; with no data in the series it
falls back to the constant and says so. The pure arithmetic is tested in
test_emissions_stepwise.py (fast tier)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemons import Prometheus, tool

pytestmark = pytest.mark.prometheus

REPORT = str(Path(sys.executable).parent / "slurm-gpu-report")
HOUR = 3600
GPU_W = (360.0, 720.0)  # the job's GPU power in its first and its second hour
CPU_W = 90.0
FACTOR = (200.0, 500.0)  # the grid's gCO2e/kWh in those hours
TRUTH_G = sum((g + CPU_W) / 1000 * f for g, f in zip(GPU_W, FACTOR, strict=True))
TOTAL_KWH = sum(g + CPU_W for g in GPU_W) / 1000


def _openmetrics(start: int) -> str:
    """The job's series every 15 s over its two hours, and the factor over a wider span."""
    job = 'jobid="101",user="alice",instance="gpu01:9817",job="slurm-gpu"'
    gpu = job + ',gpu="0",uuid="GPU-a"'
    rows: dict[str, list[str]] = {}
    gpu_j = cpu_j = 0.0
    for t in range(start, start + 2 * HOUR + 1, 15):
        if t > start:
            gpu_j += GPU_W[min(1, (t - 1 - start) // HOUR)] * 15
            cpu_j += CPU_W * 15
        rows.setdefault("info", []).append(f"slurm_job_info{{{job}}} 1 {t}")
        rows.setdefault("start", []).append(f"slurm_job_start_time_seconds{{{job}}} {start} {t}")
        rows.setdefault("end", []).append(
            f"slurm_job_end_time_seconds{{{job}}} {start + 2 * HOUR} {t}")
        rows.setdefault("alloc", []).append(
            f"slurm_job_gpu_allocated_seconds_total{{{gpu}}} {t - start} {t}")
        rows.setdefault("energy", []).append(
            f"slurm_job_gpu_energy_joules_total{{{gpu}}} {gpu_j} {t}")
        rows.setdefault("cpu", []).append(
            f'slurm_job_cpu_energy_joules_total{{{job},domain="package"}} {cpu_j} {t}')
    for t in range(start - HOUR, start + 3 * HOUR, 60):
        rows.setdefault("factor", []).append(
            f'grid_carbon_intensity_gco2e_per_kwh{{zone="test"}} '
            f"{FACTOR[0] if t < start + HOUR else FACTOR[1]} {t}")
    # OpenMetrics: each family's type, then its samples together, in time order.
    families = [("info", "slurm_job_info", "gauge"),
                ("start", "slurm_job_start_time_seconds", "gauge"),
                ("end", "slurm_job_end_time_seconds", "gauge"),
                ("alloc", "slurm_job_gpu_allocated_seconds", "counter"),
                ("energy", "slurm_job_gpu_energy_joules", "counter"),
                ("cpu", "slurm_job_cpu_energy_joules", "counter"),
                ("factor", "grid_carbon_intensity_gco2e_per_kwh", "gauge")]
    lines = []
    for key, family, kind in families:
        lines.append(f"# TYPE {family} {kind}")
        lines.extend(rows[key])
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, int]]:
    work = tmp_path_factory.mktemp("emissions-prom")
    start = (int(time.time()) - 5 * HOUR) // 60 * 60
    source = work / "backfill.om"
    source.write_text(_openmetrics(start))
    subprocess.run([tool("promtool", package="prometheus"), "tsdb", "create-blocks-from",
                    "openmetrics", str(source), str(work / "data")],
                   check=True, capture_output=True, timeout=120)
    server = Prometheus("prometheus", {"global": {"scrape_interval": "15s"},
                                       "scrape_configs": []}, work,
                        extra_args=("--storage.tsdb.retention.time=30d",))
    try:
        server.wait_ready()
        server.wait_for('slurm_job_info{jobid="101"}[6h]', timeout=60)
        yield server, start
    finally:
        server.stop()


def _job(prom: Prometheus, start: int, tmp_path: Path, energy: str) -> dict:  # type: ignore[type-arg]
    config = tmp_path / "report.toml"
    config.write_text(energy)
    done = subprocess.run(
        [REPORT, "job", "101", "--start", str(start - 600), "--end", str(start + 2 * HOUR + 600),
         "--config", str(config), "--format", "json", "--prometheus-url", prom.url],
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    (job,) = shown["jobs"] if isinstance(shown, dict) else shown
    return job  # type: ignore[no-any-return]


def test_each_steps_energy_is_counted_at_the_factor_of_its_time(
        prom: tuple[Prometheus, int], tmp_path: Path) -> None:
    server, start = prom
    job = _job(server, start, tmp_path, "[energy]\nemissions_gco2e_per_kwh = 300\n"
               'emissions_series = \'grid_carbon_intensity_gco2e_per_kwh{zone="test"}\'\n')
    assert job["energy_kwh"] + job["cpu_energy_kwh"] == pytest.approx(TOTAL_KWH, rel=1e-3)
    # one 60 s step at the change of factor may take either hour's: 0.3 % of the energy
    assert job["emissions_gco2e"] == pytest.approx(TRUTH_G, rel=0.01)
    assert job["emissions_gco2e"] != pytest.approx(TOTAL_KWH * 300, rel=0.02)
    assert any("from the series grid_carbon_intensity" in n for n in job["notes"])


def test_a_series_without_data_falls_back_to_the_constant_and_says_so(
        prom: tuple[Prometheus, int], tmp_path: Path) -> None:
    server, start = prom
    job = _job(server, start, tmp_path, "[energy]\nemissions_gco2e_per_kwh = 300\n"
               'emissions_series = \'grid_carbon_intensity_gco2e_per_kwh{zone="none"}\'\n')
    assert job["emissions_gco2e"] == pytest.approx(TOTAL_KWH * 300, rel=1e-3)
    assert any("had no data in the window; at the constant factor 300" in n
               for n in job["notes"])


def test_the_archive_stores_the_emissions_of_the_series(prom: tuple[Prometheus, int],
                                                        tmp_path: Path) -> None:
    server, start = prom
    config = tmp_path / "report.toml"
    config.write_text("[energy]\nemissions_gco2e_per_kwh = 300\n"
                      'emissions_series = \'grid_carbon_intensity_gco2e_per_kwh{zone="test"}\'\n')
    db = f"sqlite:///{tmp_path / 'archive.sqlite'}"
    window = ["--start", str(start - 600), "--end", str(start + 2 * HOUR + 600)]
    done = subprocess.run([REPORT, "archive", *window, "--no-sacct", "--config", str(config),
                           "--db", db, "--prometheus-url", server.url],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    from slurm_gpu_exporter.report.archive.store import ArchiveStore

    with ArchiveStore(db, write=False) as store:
        ((detail, _),) = store.details(["101"])["101"]
    assert detail.total_energy_kwh == pytest.approx(TOTAL_KWH, rel=1e-3)
    assert detail.emissions_gco2e == pytest.approx(TRUTH_G, rel=0.01)
