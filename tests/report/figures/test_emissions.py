"""Emissions: a job's energy from its counters times the configured gCO2e/kWh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.rules import job_facts, load_config
from slurm_gpu_exporter.report.render import text
from tests.report.sample_data import job_details


def test_no_factor_by_default_shows_no_emissions() -> None:
    config = load_config(None)
    assert config.emissions_gco2e_per_kwh is None
    [idle, _] = job_details()
    assert idle.emissions_gco2e is None
    assert json.loads(text.job_json([idle], 1))["jobs"][0]["emissions_gco2e"] is None


def test_job_kwh_and_gco2e_are_the_counters_integral_times_the_factor(tmp_path: Path) -> None:
    path = tmp_path / "report.toml"
    path.write_text("[energy]\nemissions_gco2e_per_kwh = 412.5\n")
    config = load_config(str(path))
    assert config.emissions_gco2e_per_kwh == 412.5
    for detail in job_details():
        detail.gco2e_per_kwh = config.emissions_gco2e_per_kwh
        detail.nodes[0].cpu_energy_j = 1.8e6  # the job's CPU and DRAM share: 0.5 kWh
        # the integral of the job's energy counters: the sum of their increases (J)
        joules = sum(g.energy_j for n in detail.nodes for g in n.gpus) + 1.8e6
        row = json.loads(text.job_json([detail], 1))["jobs"][0]
        assert row["energy_kwh"] + row["cpu_energy_kwh"] == pytest.approx(joules / 3.6e6)
        assert row["cpu_energy_kwh"] == pytest.approx(0.5)
        assert row["emissions_gco2e"] == pytest.approx(joules / 3.6e6 * 412.5)
        facts = job_facts(detail, config)
        assert facts["emissions_gco2e"] == pytest.approx(joules / 3.6e6 * 412.5)
        assert "Emissions" in text.job_table([detail])


@pytest.mark.parametrize("value", ["-1", "20000", '"much"'])
def test_a_bad_factor_is_refused(tmp_path: Path, value: str) -> None:
    path = tmp_path / "report.toml"
    path.write_text(f"[energy]\nemissions_gco2e_per_kwh = {value}\n")
    with pytest.raises(ReportError, match=r"emissions|could not convert"):
        load_config(str(path))


def test_usage_emissions_are_the_archived_energy_times_the_factor(tmp_path: Path) -> None:
    from slurm_gpu_exporter.report.archive.store import ArchiveStore
    from slurm_gpu_exporter.report.archive.usage import month_window, usage_report
    from slurm_gpu_exporter.report.render.usage import render_usage
    from tests.report.archive.archive_data import DEC_1, record

    url = f"sqlite:///{tmp_path / 'a.sqlite'}"
    with ArchiveStore(url, write=True) as store:
        store.store([record("1", user="alice", hours=1.0), record("2", user="bob", hours=2.0)],
                    archived_at=DEC_1)
    with ArchiveStore(url, write=False) as store:
        report = usage_report(store, month_window("2026-11", DEC_1 + 86400), ["user"])
    assert "emissions_kg" not in render_usage(report, "csv")  # no factor: no column
    report.gco2e_per_kwh = 300.0
    rows = {g["user"]: g for g in json.loads(render_usage(report, "json"))["groups"]}
    for group in report.groups:
        row = rows[group.key[0]]
        assert row["energy_kwh"] == pytest.approx(group.energy_j / 3.6e6)
        assert row["emissions_kg"] == pytest.approx(group.energy_j / 3.6e6 * 300.0 / 1000)
    assert render_usage(report, "csv").splitlines()[0].endswith(",emissions_kg")
    for fmt in ("table", "markdown", "html"):
        assert "kgCO2e" in render_usage(report, fmt)


def test_the_cpu_energy_of_a_node_is_its_domains_increases_in_the_window() -> None:
    from slurm_gpu_exporter.report.prometheus.client import Sample
    from slurm_gpu_exporter.report.prometheus.job_figures import jobs_from_answers
    from slurm_gpu_exporter.report.prometheus.queries import Filters

    def sample(value: float, **labels: str) -> Sample:
        return Sample({"jobid": "9", "instance": "gpu01:9400", **labels}, value)

    got = {
        "info": [sample(1.0, user="alice")],
        "cpu_energy": [sample(7.2e6, domain="package"), sample(0.9e6, domain="dram")],
        "cpu_energy_base": [sample(3.6e6, domain="package")],  # before the window
    }
    [(_usage, [node])] = jobs_from_answers(got, Filters()).values()
    assert node.cpu_energy_j == pytest.approx(3.6e6 + 0.9e6)


def test_an_archived_job_shows_its_gpu_and_cpu_kwh_and_its_archived_emissions(
        tmp_path: Path) -> None:
    from slurm_gpu_exporter.report.archive.store import ArchiveStore
    from tests.report.archive.archive_data import DEC_1, record

    rec = record("7", gpus=1, hours=1.0)
    rec.detail.nodes[0].cpu_energy_j = 0.9e6
    rec.detail.gco2e_per_kwh = 250.0  # the factor `archive` was configured with
    url = f"sqlite:///{tmp_path / 'a.sqlite'}"
    with ArchiveStore(url, write=True) as store:
        store.store([rec], archived_at=DEC_1)
    with ArchiveStore(url, write=False) as store:
        ((detail, _),) = store.details(["7"])["7"]
    kwh = 3600 * 300 / 3.6e6 + 0.25
    assert detail.total_energy_kwh == pytest.approx(kwh)
    assert detail.emissions_gco2e == pytest.approx(kwh * 250.0)
    shown = json.loads(text.job_json([detail], 0))
    (job,) = shown["jobs"] if isinstance(shown, dict) else shown
    assert job["cpu_energy_kwh"] == pytest.approx(0.25)
    assert job["emissions_gco2e"] == pytest.approx(kwh * 250.0)
    table = text.job_table([detail])
    assert "CPU and DRAM energy" in table and "gCO2e" in table


@pytest.mark.parametrize("value", ['"up\\nup"', "3", '"' + "x" * 1001 + '"'])
def test_a_bad_emissions_series_is_refused(tmp_path: Path, value: str) -> None:
    path = tmp_path / "report.toml"
    path.write_text(f"[energy]\nemissions_series = {value}\n")
    with pytest.raises(ReportError, match="emissions_series must be one line of PromQL"):
        load_config(str(path))


def test_the_emissions_series_is_read_from_the_config(tmp_path: Path) -> None:
    path = tmp_path / "report.toml"
    path.write_text("[energy]\nemissions_series = ' grid_gco2e_per_kwh{zone=\"DE\"} '\n")
    assert load_config(str(path)).emissions_series == 'grid_gco2e_per_kwh{zone="DE"}'
    assert load_config(None).emissions_series is None
