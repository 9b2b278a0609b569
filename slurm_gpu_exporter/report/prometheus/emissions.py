"""The range queries of emissions from a site's carbon-intensity series: the jobs' GPU
and CPU energy counters and the series, on one step grid; three queries whatever the
number of jobs."""

from __future__ import annotations

import math

from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.prometheus.client import PrometheusClient, Series, gather
from slurm_gpu_exporter.report.prometheus.queries import (
    CPU_ENERGY,
    ENERGY,
    Filters,
    jobid_regex,
    selector,
)

MAX_POINTS = 10_000  # Prometheus refuses more than 11,000 points per series
MIN_STEP = 60.0


def step_of(window: Window) -> float:
    """A step that keeps every series under MAX_POINTS points over the window."""
    return max(MIN_STEP, float(math.ceil((window.end - window.start) / MAX_POINTS)))


async def fetch_energy_and_factor(prom: PrometheusClient, window: Window, jobids: list[str],
                                  filters: Filters, series: str
                                  ) -> tuple[dict[str, list[Series]], list[Series]]:
    """Each job's energy counters (GPU ones and CPU ones, summed per job and node) and
    the factor series, every step over the window."""
    equal = filters.matchers()
    ids = {"jobid": jobid_regex(jobids)}
    by = "jobid, instance"
    queries = [f"sum by ({by}) ({selector(ENERGY, equal, ids)})",
               f"sum by ({by}) ({selector(CPU_ENERGY, equal, ids)})",
               series]
    step = step_of(window)
    gpu, cpu, factor = await gather(*(prom.range(q, window.start, window.end, step)
                                      for q in queries))
    energy: dict[str, list[Series]] = {}
    for s in (*gpu, *cpu):
        energy.setdefault(s.labels.get("jobid", ""), []).append(s)
    return energy, factor
