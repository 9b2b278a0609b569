"""The pure arithmetic of one run of driver utilization samples: busy seconds, the time
they cover, and the gaps left out as unknown. No I/O, no clocks: plain numbers in."""

from __future__ import annotations

import itertools
from collections.abc import Collection
from typing import NamedTuple

from slurm_gpu_exporter.gpu.readings import UtilSample

# A sample covers the time since the one before it, unless that gap is longer than
# this many sample periods (one missing sample with the usual jitter is ~2.3): then
# the GPU was idle (drivers take no samples while it is) and the sample covers one
# period; the rest of the gap is idle time.
COVER_PERIODS = 2.5
# Where the period is not known yet, a sample covers at most this much.
DEFAULT_COVER_S = 2.0
def measured_period_us(samples: tuple[UtilSample, ...], previous_us: int = 0) -> int:
    """The driver's sample period (µs): the median spacing of these samples, or the one
    measured before where there are too few."""
    stamps = [s.timestamp_us for s in samples]
    spacings = [b - a for a, b in itertools.pairwise(stamps) if b > a]
    return int(_median(spacings)) if len(spacings) >= 2 else previous_us


def _median(values: list[int]) -> float:
    """statistics.median, without importing statistics (decimal and fractions: 0.6 MiB
    of the agent's memory for one median)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def cover_limit_us(period_us: int) -> float:
    """The longest gap one sample covers; longer gaps hold idle time."""
    return COVER_PERIODS * period_us if period_us else DEFAULT_COVER_S * 1e6


class Integrated(NamedTuple):
    """Seconds from one run of driver samples: counted (``window``), busy within it, and
    ``unknown``: gaps left out because samples may have been lost there."""

    window: float
    busy: float
    unknown: float


def integrate_samples(samples: tuple[UtilSample, ...], cursor_us: int | None,
                      not_before_us: int = 0, *, period_us: int = 0, counted_us: int = 0,
                      continuous: bool = True, max_gap_us: float | None = None,
                      ) -> tuple[float, float]:
    """(window, busy) seconds from driver samples: integrate_gaps without the unknown."""
    got = integrate_gaps(samples, cursor_us, not_before_us, period_us=period_us,
                         counted_us=counted_us, continuous=continuous, max_gap_us=max_gap_us)
    return got.window, got.busy


def integrate_gaps(samples: tuple[UtilSample, ...], cursor_us: int | None,
                   not_before_us: int = 0, *, period_us: int = 0, counted_us: int = 0,
                   continuous: bool = True, max_gap_us: float | None = None,
                   breaks: Collection[int] = ()) -> Integrated:
    """Seconds from driver samples, each covering the time since the one before.

    With no cursor (first look) the first sample only starts the window. After a gap
    longer than ``cover_limit_us`` a sample covers one period (measured from the
    samples, else ``period_us``) and the rest of the gap counts as idle: in the
    window, not busy. A gap is left out of both instead where samples may have been
    lost: from a cursor this agent did not read ``continuous``-ly (restored from the
    state dir, re-based) or before a sample in ``breaks`` (the first of a read
    that found the driver's buffer full: it may have overwritten samples), counted
    as ``unknown``; or longer than ``max_gap_us`` (the clock jumped: not time at
    all). Time before ``not_before_us`` (a job's start) or ``counted_us`` (counted
    already as idle) is left out too. Percentages are clamped to 0..100.
    """
    period = measured_period_us(samples, period_us)
    cover = cover_limit_us(period)
    floor = max(not_before_us, counted_us)
    window = busy = unknown = 0.0
    previous = cursor_us
    for sample in samples:
        ts = sample.timestamp_us
        if previous is None:
            previous = ts
            continue
        gap = ts - previous
        if gap <= 0:
            continue
        if max_gap_us is not None and gap > max_gap_us:
            previous = ts  # the clock jumped
            continue
        if gap > cover and ((previous == cursor_us and not continuous) or ts in breaks):
            unknown += max(0.0, ts - max(previous, floor)) / 1e6  # samples may be lost
            previous = ts
            continue
        covered_from = previous if gap <= cover else ts - (period or cover)
        start = max(previous, floor)
        if ts > start:
            window += (ts - start) / 1e6
        busy_from = max(covered_from, floor)
        if ts > busy_from:
            busy += (ts - busy_from) / 1e6 * min(max(sample.percent, 0.0), 100.0) / 100.0
        previous = ts
    return Integrated(window, busy, unknown)
