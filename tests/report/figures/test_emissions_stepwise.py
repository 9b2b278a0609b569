"""Emissions over a carbon-intensity series, step by step (pure: no Prometheus). The
expected figures are worked out by hand in the comments, not by the code under test."""

from __future__ import annotations

import pytest

from slurm_gpu_exporter.report.figures.emissions import series_factor, stepwise

KWH = 3.6e6  # joules


def test_each_step_takes_the_factor_in_force_at_its_end() -> None:
    # Two counters (two GPUs), steps ending at 60, 120, 180, 240 s; a factor that
    # changes three times: 100 from t=0, 300 from t=120, 50 from t=200.
    gpu0 = [(0.0, 0.0), (60.0, 1 * KWH), (120.0, 3 * KWH), (180.0, 4 * KWH),
            (240.0, 4.5 * KWH)]
    gpu1 = [(0.0, 0.0), (60.0, 2 * KWH), (120.0, 2 * KWH), (180.0, 2.5 * KWH),
            (240.0, 3.5 * KWH)]
    factor = [(0.0, 100.0), (120.0, 300.0), (200.0, 50.0)]
    got = stepwise([gpu0, gpu1], factor)
    # gpu0: 1 kWh@100 (t=60) + 2@300 (t=120) + 1@300 (t=180) + 0.5@50 (t=240) = 1025
    # gpu1: 2 kWh@100 + 0@300 + 0.5@300 + 1@50 = 400
    assert got.grams == pytest.approx(1425.0)
    assert got.kwh == pytest.approx(8.0)
    assert got.uncovered_kwh == 0.0
    factor_mean, said = series_factor([gpu0, gpu1], [factor], "grid", 999.0)
    assert factor_mean == pytest.approx(1425.0 / 8.0)  # 178.125
    assert "a mean of 178 gCO2e/kWh" in said


def test_a_counter_reset_counts_from_zero_and_early_steps_take_the_constant() -> None:
    # A restart at t=120: the counter drops from 3 kWh to 0.5 kWh, so that step adds
    # 0.5 kWh (from 0), never a negative amount. The series starts at t=100.
    energy = [[(0.0, 0.0), (60.0, 1 * KWH), (90.0, 3 * KWH), (120.0, 0.5 * KWH),
               (180.0, 1.5 * KWH)]]
    factor = [(100.0, 400.0), (150.0, 200.0)]
    got = stepwise(energy, factor)
    # 1 kWh (t=60) and 2 kWh (t=90) before the series: uncovered; 0.5@400 + 1@200 = 400 g
    assert (got.grams, got.kwh, got.uncovered_kwh) == pytest.approx((400.0, 4.5, 3.0))
    mean, said = series_factor(energy, [factor], "grid", 100.0)
    # (400 g + 3 kWh at the constant 100) / 4.5 kWh
    assert mean == pytest.approx(700.0 / 4.5)
    assert "67 % of the energy before its first value at 100" in said


def test_several_factor_series_or_none_fall_back_to_the_constant() -> None:
    energy = [[(0.0, 0.0), (60.0, KWH)]]
    factor, said = series_factor(energy, [[(0, 1.0)], [(0, 2.0)]], "s", None)
    assert factor is None and "gave 2 series" in said
    factor, said = series_factor(energy, [], "s", 300.0)
    assert factor == 300.0 and "had no data in the window" in said
