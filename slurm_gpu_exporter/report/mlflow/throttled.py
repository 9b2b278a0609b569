"""How long the jobs' GPUs were throttled, by reason, where the agent measures it
(``slurm_job_gpu_throttled_seconds_total{reason}``): two queries for any number of jobs,
over the same window and with the same start baseline as the job figures. No such series
(an older agent, or no GPU that reports it): an empty answer, not an error."""

from __future__ import annotations

from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.prometheus.client import PrometheusClient, gather
from slurm_gpu_exporter.report.prometheus.queries import (
    BASELINE_LOOKBACK,
    Filters,
    jobid_regex,
    selector,
)

THROTTLED = "slurm_job_gpu_throttled_seconds_total"


def throttled_queries(window: Window, jobids: list[str], filters: Filters) -> tuple[str, str]:
    """The GPU-seconds throttled by job and reason over the window, and at its start."""
    s = selector(THROTTLED, filters.matchers(), {"jobid": jobid_regex(jobids)})
    d = window.range
    return (f"sum by (jobid, reason) (max_over_time({s}[{d}]))",
            f"sum by (jobid, reason) (last_over_time({s}[{BASELINE_LOOKBACK}] offset {d}))")


async def fetch_throttled(prom: PrometheusClient, window: Window, jobids: list[str],
                          filters: Filters) -> dict[str, dict[str, float]]:
    """GPU-seconds throttled, by job and reason, in the window."""
    if not jobids:
        return {}
    total_q, base_q = throttled_queries(window, jobids, filters)
    total, base = await gather(prom.instant(total_q, window.end),
                               prom.instant(base_q, window.end))
    before = {(s.labels.get("jobid", ""), s.labels.get("reason", "")): s.value for s in base}
    found: dict[str, dict[str, float]] = {}
    for sample in total:
        key = (sample.labels.get("jobid", ""), sample.labels.get("reason", ""))
        found.setdefault(key[0], {})[key[1]] = max(0.0, sample.value - before.get(key, 0.0))
    return found
