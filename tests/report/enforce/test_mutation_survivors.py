"""Behaviour that mutants of report/enforce survived in the fast tier (bench/mutation.py,
issue 55): each test here fails on the mutant it names."""

from __future__ import annotations

import pytest

from slurm_gpu_exporter.report.enforce.policy import parse_policy
from slurm_gpu_exporter.report.errors import ReportError


@pytest.mark.parametrize("fraction", ["0.0", "1.0", "1.5", "-0.1"])
def test_a_busy_fraction_outside_zero_and_one_is_refused(fraction):
    """mutmut: parse_policy's ``0 < fraction`` made ``0 <=`` (a fraction of 0 would call
    no GPU busy at all, so every job with GPUs would count as idle)."""
    with pytest.raises(ReportError, match=r"idle\.busy_fraction must be between 0 and 1"):
        parse_policy(f"[idle]\nbusy_fraction = {fraction}\n")


def test_a_busy_fraction_inside_zero_and_one_is_taken():
    assert parse_policy("[idle]\nbusy_fraction = 0.05\n") is not None
