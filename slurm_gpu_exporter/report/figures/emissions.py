"""Emissions from a carbon-intensity series: each step's energy increase times the
factor at that step, summed over the job's time (pure; the queries are in
report/prometheus/emissions.py)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

Points = list[tuple[float, float]]  # (time, value), in time order


@dataclass(frozen=True)
class StepwiseEmissions:
    """gCO2e over the steps, the kWh they cover, and the kWh of steps without a factor."""

    grams: float
    kwh: float
    uncovered_kwh: float


def increases(points: Points) -> list[tuple[float, float]]:
    """(step end, joules) of a counter's points; a drop is a reset, counted from 0."""
    steps = []
    for (_, before), (t, now) in itertools.pairwise(points):
        steps.append((t, now - before if now >= before else now))
    return steps


def factor_at(factor: Points, t: float) -> float | None:
    """The factor's last value at or before ``t`` (a step-wise series), None before its first."""
    found = None
    for when, value in factor:
        if when > t:
            break
        found = value
    return found


def stepwise(energy: list[Points], factor: Points) -> StepwiseEmissions:
    """Each counter's increase per step times the factor then (gCO2e/kWh)."""
    grams = kwh = uncovered = 0.0
    for points in energy:
        for t, joules in increases(points):
            step_kwh = joules / 3.6e6
            kwh += step_kwh
            f = factor_at(factor, t)
            if f is None:
                uncovered += step_kwh
            else:
                grams += step_kwh * f
    return StepwiseEmissions(grams, kwh, uncovered)


def series_factor(energy: list[Points], factor: list[Points], series: str,
                  constant: float | None) -> tuple[float | None, str]:
    """The job's factor (gCO2e/kWh, weighted by its energy over the steps) and the line
    that says where it came from; the constant where the series has no data."""
    fallback = (f"at the constant factor {constant:g} gCO2e/kWh" if constant
                else "none shown (no constant factor is set)")
    if len(factor) > 1:
        return constant, (f"Emissions: the series {series} gave {len(factor)} series, not "
                          f"one; {fallback}.")
    points = factor[0] if factor else []
    if not points:
        return constant, f"Emissions: the series {series} had no data in the window; {fallback}."
    got = stepwise(energy, points)
    if got.kwh <= 0:
        return constant, (f"Emissions: no energy samples of the job on the series' steps; "
                          f"{fallback}.")
    covered = got.kwh - got.uncovered_kwh
    if covered <= 0:
        return constant, (f"Emissions: the series {series} had no data in the job's time; "
                          f"{fallback}.")
    mean = got.grams / covered
    rest = ""
    if got.uncovered_kwh > 0:
        share = f"{100 * got.uncovered_kwh / got.kwh:.0f} %"
        if constant:
            rest = f"; {share} of the energy before its first value at {constant:g}"
            mean = (got.grams + got.uncovered_kwh * constant) / got.kwh
        else:
            rest = f"; {share} of the energy before its first value at the series' mean"
    return mean, (f"Emissions from the series {series}, step by step over the job's time "
                  f"(a mean of {mean:.0f} gCO2e/kWh by energy{rest}).")
