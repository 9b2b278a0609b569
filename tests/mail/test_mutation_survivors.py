"""Behaviour that mutants of mail/ survived in the fast tier (bench/mutation.py, issue 55):
each test here fails on the mutant it names."""

from __future__ import annotations

from slurm_gpu_exporter.mail.summary import summary_text

JOB = {"job": "42", "gpus": 4, "gpu_hours": 8.0, "busy_ratio": 0.25, "cpu_efficiency": 0.5,
       "cpu_energy_kwh": 0.4567, "notes": ["3 of 4 GPUs idle: ask for 1"]}


def _lines(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.splitlines()]


def test_summary_shows_the_cpu_efficiency_and_the_cpu_energy_estimate() -> None:
    """mutmut: summary_text dropping the CPU efficiency value, renaming the CPU energy row."""
    lines = _lines(summary_text(JOB))
    assert "CPU efficiency: 50%" in lines
    assert "CPU+DRAM energy: 0.457 kWh (estimate)" in lines


def test_summary_heads_the_notes() -> None:
    """mutmut: summary_text's "Notes:" heading upper-cased."""
    lines = _lines(summary_text(JOB))
    assert lines[lines.index("Notes:") + 1] == "- 3 of 4 GPUs idle: ask for 1"
