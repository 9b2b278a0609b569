"""Every output format on fixed data, against checked-in files.

Regenerate after an intended change with
``UPDATE_GOLDEN=1 .venv/bin/pytest tests/report/render/test_golden.py`` and review the diff.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_gpu_exporter.report.figures.rules import job_facts, load_config, notes_for
from slurm_gpu_exporter.report.render import html, text
from tests.report.sample_data import empty_low_util_report, job_details, low_util_report

GOLDEN = Path(__file__).parent / "golden"


def details():  # type: ignore[no-untyped-def]
    config = load_config(None)
    found = job_details()
    for detail in found:
        detail.gco2e_per_kwh = 250.0  # a site's configured grid intensity
        detail.notes = notes_for(job_facts(detail, config), config.notes)
    return found


CASES: dict[str, Callable[[], str]] = {
    "low_util.txt": lambda: text.low_util_table(low_util_report()),
    "low_util_empty.txt": lambda: text.low_util_table(empty_low_util_report()),
    "low_util.csv": lambda: text.low_util_csv(low_util_report()),
    "low_util.json": lambda: text.low_util_json(low_util_report()),
    "low_util.md": lambda: text.low_util_markdown(low_util_report()),
    "low_util.html": lambda: html.low_util_html(low_util_report()),
    "job.txt": lambda: text.job_table(details()),
    "job.csv": lambda: text.job_csv(details()),
    "job.json": lambda: text.job_json(details(), 16),
    "job.md": lambda: text.job_markdown(details()),
    "job.html": lambda: html.job_html(details()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_matches_golden_file(name: str) -> None:
    produced = CASES[name]()
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(produced)
    assert path.exists(), f"no golden file {path}: run with UPDATE_GOLDEN=1"
    assert produced == path.read_text()
