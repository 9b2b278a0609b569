"""The range queries of emissions from a site's carbon-intensity series: the jobs' GPU
and CPU energy counters and the series, on one step grid; three queries whatever the
number of jobs."""

from __future__ import annotations

import math

from slurm_gpu_exporter.report.figures.emissions import series_factor
from slurm_gpu_exporter.report.figures.rules import Config
from slurm_gpu_exporter.report.figures.shapes import JobDetail
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


async def apply_series_factor(prom: PrometheusClient, window: Window,
                              details: list[JobDetail], filters: Filters, config: Config
                              ) -> dict[str, str]:
    """Set each job's factor from the site's series (three range queries for all jobs);
    the line that says where each factor came from, by job id."""
    assert config.emissions_series
    energy, factor = await fetch_energy_and_factor(
        prom, window, [d.usage.jobid for d in details], filters, config.emissions_series)
    said = {}
    for detail in details:
        jobid = detail.usage.jobid
        # Only the job's own time: the factor outside it weighs nothing.
        points = [[p for p in s.points if _within(detail, p[0])] for s in energy.get(jobid, [])]
        detail.gco2e_per_kwh, said[jobid] = series_factor(
            points, [s.points for s in factor], config.emissions_series,
            config.emissions_gco2e_per_kwh)
    return said


def _within(detail: JobDetail, t: float) -> bool:
    return ((detail.start is None or t >= detail.start - 60)
            and (detail.end is None or t <= detail.end + 60))
