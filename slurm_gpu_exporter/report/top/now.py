"""What one job does now: the rates between its two latest samples, and its gauges.

A fixed number of instant queries whatever the job's size, each narrowed to the one
job id (and the cluster filter). "Now" is ``irate``: the change between the last two
samples of each counter, so it follows the job at the scrape interval, and a
counter's reset (an agent restart) is not a spike. The whole-life figures come from
the ``job`` report's queries (``prometheus.job_figures.fetch_jobs``), not from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slurm_gpu_exporter.report.prometheus.client import PrometheusClient, Sample, gather
from slurm_gpu_exporter.report.prometheus.queries import (
    ALLOCATED,
    BUSY,
    CPU,
    ENERGY,
    SM_ACTIVE,
    Filters,
    jobid_regex,
    selector,
)

# Long enough to hold two scrapes at the monitoring role's 30 s interval (and a late one).
RATE_RANGE = "2m"
# A job whose series have had no sample for this long is no longer measured: it ended
# (and its end mark was not scraped) or its node stopped reporting.
STALE_AFTER_S = 180.0


@dataclass
class GpuNow:
    """One GPU of the job, now. None: not measured (no GPM, no sample)."""

    busy: float | None = None  # busy share between the last two samples (0..1)
    sm_active: float | None = None
    memory_used: float | None = None  # bytes, the job's processes on this GPU
    power_w: float | None = None  # the job's share of the GPU's power
    temperature_c: float | None = None  # the device's


@dataclass
class NodeNow:
    """The job on one node, now."""

    cpu_cores: float | None = None  # CPU-seconds per second: cores busy
    memory_used: float | None = None  # bytes


@dataclass
class JobNow:
    """Keyed by Prometheus target (instance) and GPU index, as the job's series are."""

    gpus: dict[tuple[str, str], GpuNow] = field(default_factory=dict)
    nodes: dict[str, NodeNow] = field(default_factory=dict)
    last_sample: float | None = None  # newest sample of the job's GPU series (Unix time)

    def stale(self, at: float) -> bool:
        """True when no sample of the job came in the last ``STALE_AFTER_S`` seconds."""
        return self.last_sample is None or at - self.last_sample > STALE_AFTER_S


def now_queries(jobid: str, filters: Filters) -> dict[str, str]:
    """The queries of one frame, by name."""
    jobid_regex([jobid])  # a bad id is said before any query
    sel = {**filters.matchers(), "jobid": jobid}
    gpu, node, r = "instance, gpu", "instance", RATE_RANGE

    def s(metric: str) -> str:
        return selector(metric, sel)

    held = f"group by (instance, uuid) ({s(ALLOCATED)})"
    device = selector("slurm_gpu_temperature_celsius", filters.matchers())
    return {
        "allocated": f"sum by ({gpu}) (irate({s(ALLOCATED)}[{r}]))",
        "busy": f"sum by ({gpu}) (irate({s(BUSY)}[{r}]))",
        "sm_active": f"sum by ({gpu}) (irate({s(SM_ACTIVE)}[{r}]))",
        "power": f"sum by ({gpu}) (irate({s(ENERGY)}[{r}]))",
        "gpu_memory": f"sum by ({gpu}) ({s('slurm_job_gpu_memory_used_bytes')})",
        # The device's temperature, for the GPUs the job holds (matched by UUID); the
        # job's GPU index joins it in ``_temperatures``.
        "temperature": f"max by (instance, uuid) ({device} and on (instance, uuid) {held})",
        "uuids": f"group by ({gpu}, uuid) ({s(ALLOCATED)})",
        "cpu": f"sum by ({node}) (irate({s(CPU)}[{r}]))",
        "memory": f"sum by ({node}) ({s('slurm_job_memory_used_bytes')})",
        "last_sample": f"max(timestamp({s(ALLOCATED)}))",
    }


async def fetch_now(prom: PrometheusClient, jobid: str, filters: Filters, at: float
                    ) -> JobNow:
    """The job's figures now (evaluated at ``at``)."""
    queries = now_queries(jobid, filters)
    answers = await gather(*(prom.instant(q, at) for q in queries.values()))
    return job_now(dict(zip(queries, answers, strict=True)))


def job_now(got: dict[str, list[Sample]]) -> JobNow:
    """The answers to ``now_queries`` as a ``JobNow``."""

    def per_gpu(name: str) -> dict[tuple[str, str], float]:
        return {(s.labels.get("instance", ""), s.labels.get("gpu", "")): s.value
                for s in got.get(name, [])}

    allocated, busy, sm = per_gpu("allocated"), per_gpu("busy"), per_gpu("sm_active")
    power, memory = per_gpu("power"), per_gpu("gpu_memory")
    temps = {(s.labels.get("instance", ""), s.labels.get("uuid", "")): s.value
             for s in got.get("temperature", [])}
    now = JobNow()
    for s in got.get("uuids", []):
        key = (s.labels.get("instance", ""), s.labels.get("gpu", ""))
        held = allocated.get(key)

        def share(part: float | None, held: float | None = held) -> float | None:
            # Over the seconds held and measured; none measured: no figure.
            if part is None or not held or held <= 0:
                return None
            return min(1.0, max(0.0, part / held))

        now.gpus[key] = GpuNow(
            busy=share(busy.get(key, 0.0)) if held else None,
            sm_active=share(sm.get(key)), memory_used=memory.get(key),
            power_w=power.get(key), temperature_c=temps.get((key[0], s.labels.get("uuid", ""))))
    for s in got.get("cpu", []):
        now.nodes.setdefault(s.labels.get("instance", ""), NodeNow()).cpu_cores = s.value
    for s in got.get("memory", []):
        now.nodes.setdefault(s.labels.get("instance", ""), NodeNow()).memory_used = s.value
    stamps = [s.value for s in got.get("last_sample", [])]
    now.last_sample = max(stamps) if stamps else None
    return now
