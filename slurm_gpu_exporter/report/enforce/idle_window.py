"""How long each running GPU job has been idle, in sliding windows ending now.

For every window the policy names (each warning, the cancel), two instant queries
give each GPU's busy and allocated seconds gained in the window (``max - min`` of the
counters there, exact since they only grow), and one gives the agent's NVML health
over it. A few more say which GPUs each job holds, whether their series are fresh,
whether the agent targets are up and when each job started. That is
``3 * windows + 5`` queries, whatever the number of jobs.

A job is idle over a window when every GPU it holds, on every node, gained less
busy time than ``busy_fraction`` of its allocated time there. Anything that makes
that doubtful (a target down, NVML down, stale series, counters that did not cover
the window) is kept as a reason, and the decisions never act on such a job.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from slurm_gpu_exporter.report.enforce.policy import span
from slurm_gpu_exporter.report.figures.table import figure
from slurm_gpu_exporter.report.prometheus.client import PrometheusClient, Sample, gather
from slurm_gpu_exporter.report.prometheus.nodes import NODE_INFO_LABEL, node_name, series_node
from slurm_gpu_exporter.report.prometheus.queries import (
    ALLOCATED,
    BUSY,
    Filters,
    selector,
    with_node,
)

# A GPU's allocated seconds must have grown by this share of the window, else its
# series have gaps there (agent down, sampler stuck) and the window proves nothing.
MIN_COVERAGE = 0.8
# A series or an agent sample older than this is stale.
STALE_AFTER_S = 180.0
START = figure("start").metric  # the job figures' series: figures/table.py
LAST_SAMPLE = "slurm_gpu_exporter_last_sample_timestamp_seconds"
SOURCE_UP = "slurm_gpu_exporter_source_up"

GpuKey = tuple[str, str]  # (instance, gpu)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WindowUsage:
    """What one window says about one job."""

    seconds: float
    idle: bool
    doubt: str | None  # why this window cannot be trusted, or None


@dataclass
class JobIdleness:
    """One running GPU job as the metrics show it."""

    jobid: str
    user: str
    start: float | None
    gpus: list[GpuKey] = field(default_factory=list)
    windows: list[WindowUsage] = field(default_factory=list)  # shortest first
    doubts: list[str] = field(default_factory=list)  # problems now (target down, stale)
    node_of: dict[str, str] = field(default_factory=dict)  # instance -> Slurm node name
    fresh: list[GpuKey] = field(default_factory=list)  # GPUs whose series are fresh now

    @property
    def nodes(self) -> list[str]:
        return sorted({self.node_of.get(i, node_name(i)) for i, _ in self.gpus})

    @property
    def fresh_nodes(self) -> set[str]:
        """The nodes from which some GPU of the job has fresh series."""
        return {self.node_of.get(i, node_name(i)) for i, _ in self.fresh}

    def age(self, now: float) -> float | None:
        return None if self.start is None else now - self.start

    def idle_for(self, now: float) -> tuple[float, str | None]:
        """The longest window over which the job was idle (0 if none), and the doubt that
        stopped the count, if one did. A window longer than the job's life proves nothing."""
        age = self.age(now)
        longest = 0.0
        for window in self.windows:
            if age is None or age < window.seconds:
                break
            if window.doubt is not None:
                return longest, window.doubt
            if not window.idle:
                break
            longest = window.seconds
        return longest, None


def _range(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


def idle_queries(windows_s: tuple[float, ...], filters: Filters,
                 node_label: str | None = None) -> dict[str, str]:
    """The instant queries, by name; ``windows_s`` shortest first. Without a
    ``node_label`` of the site's, ``held`` carries the node each agent names."""
    sel = filters.matchers()
    longest = _range(max(windows_s))

    def s(metric: str, extra: dict[str, str] | None = None) -> str:
        return selector(metric, {**sel, **(extra or {})})

    def gained(metric: str, d: str) -> str:
        return f"max_over_time({s(metric)}[{d}]) - min_over_time({s(metric)}[{d}])"

    held = f"last_over_time({s(ALLOCATED)}[{longest}])"
    queries = {
        "held": held if node_label else with_node(held, filters, longest),
        "fresh": f"timestamp({s(ALLOCATED)})",
        "start": f"min by (jobid) (last_over_time({s(START)}[{longest}]))",
        "up": f"max by (instance) ({s('up')})",
        "last_sample": f"max by (instance) ({s(LAST_SAMPLE)})",
    }
    for seconds in windows_s:
        d = _range(seconds)
        queries[f"busy_{d}"] = gained(BUSY, d)
        queries[f"allocated_{d}"] = gained(ALLOCATED, d)
        queries[f"nvml_{d}"] = (f"min by (instance) (min_over_time("
                                f"{s(SOURCE_UP, {'source': 'nvml'})}[{d}]))")
    return queries


def _per_gpu(samples: list[Sample]) -> dict[tuple[str, GpuKey], float]:
    return {(s.labels.get("jobid", ""), (s.labels.get("instance", ""), s.labels.get("gpu", ""))):
            s.value for s in samples}


def _per_instance(samples: list[Sample]) -> dict[str, float]:
    return {s.labels.get("instance", ""): s.value for s in samples}


def jobs_from_answers(answers: dict[str, list[Sample]], windows_s: tuple[float, ...],
                      busy_fraction: float, now: float, node_label: str | None = None
                      ) -> list[JobIdleness]:
    """The jobs the answers show, with their windows and doubts (pure: no I/O). Each
    GPU's node is its ``node_label`` label where given (port dropped), else the node
    its agent names, else its target's host (``nodes.series_node``)."""
    jobs: dict[str, JobIdleness] = {}
    starts = {s.labels.get("jobid", ""): s.value for s in answers["start"]}
    for sample in answers["held"]:
        jobid = sample.labels.get("jobid", "")
        job = jobs.get(jobid)
        if job is None:
            job = jobs[jobid] = JobIdleness(jobid, sample.labels.get("user", ""),
                                            starts.get(jobid))
        instance = sample.labels.get("instance", "")
        job.gpus.append((instance, sample.labels.get("gpu", "")))
        job.node_of[instance] = series_node(sample.labels, node_label)
    fresh = _per_gpu(answers["fresh"])
    up = _per_instance(answers["up"])
    last_sample = _per_instance(answers["last_sample"])
    # Each window's answers indexed once: per job they would cost jobs x series.
    by_window = [(seconds, _per_gpu(answers[f"busy_{_range(seconds)}"]),
                  _per_gpu(answers[f"allocated_{_range(seconds)}"]),
                  _per_instance(answers[f"nvml_{_range(seconds)}"])) for seconds in windows_s]
    for job in jobs.values():
        job.gpus.sort()
        job.doubts = _doubts_now(job, fresh, up, last_sample, now)
        job.fresh = [g for g in job.gpus if now - fresh.get((job.jobid, g), -1e18)
                     <= STALE_AFTER_S]
        if job.start is None:
            job.doubts.append("no start time in the metrics")
        for seconds, busy, allocated, nvml in by_window:
            job.windows.append(_window(job, seconds, busy, allocated, nvml, busy_fraction))
    return sorted(jobs.values(), key=lambda j: (len(j.jobid), j.jobid))


def _doubts_now(job: JobIdleness, fresh: dict[tuple[str, GpuKey], float],
                up: dict[str, float], last_sample: dict[str, float], now: float) -> list[str]:
    doubts = []
    for instance in sorted({i for i, _ in job.gpus}):
        if up.get(instance) == 0:
            doubts.append(f"the agent target {instance} is down")
            continue
        sampled = last_sample.get(instance)
        if sampled is None or now - sampled > STALE_AFTER_S:
            doubts.append(f"the agent on {instance} has no recent sample")
    for gpu in job.gpus:
        seen = fresh.get((job.jobid, gpu))
        if seen is None or now - seen > STALE_AFTER_S:
            doubts.append(f"the series of GPU {gpu[1]} on {gpu[0]} are stale or absent")
    return doubts


def _window(job: JobIdleness, seconds: float, busy: dict[tuple[str, GpuKey], float],
            allocated: dict[tuple[str, GpuKey], float], nvml: dict[str, float],
            busy_fraction: float) -> WindowUsage:
    idle, doubt = True, None
    for instance in sorted({i for i, _ in job.gpus}):
        if nvml.get(instance) == 0:
            return WindowUsage(seconds, False, f"NVML was down on {instance} in the last "
                                                 f"{span(seconds)}")
    for gpu in job.gpus:
        held = allocated.get((job.jobid, gpu))
        used = busy.get((job.jobid, gpu))
        if held is None or used is None or held < MIN_COVERAGE * seconds:
            doubt = doubt or (f"the counters of GPU {gpu[1]} on {gpu[0]} do not cover the "
                              f"last {span(seconds)}")
            continue
        if used >= busy_fraction * held:
            idle = False
    return WindowUsage(seconds, idle, doubt)


async def fetch_idleness(prom: PrometheusClient, windows_s: tuple[float, ...],
                         filters: Filters, busy_fraction: float, now: float,
                         node_label: str | None = None) -> list[JobIdleness]:
    """Every job that held GPUs in the longest window, from one batch of queries.

    A query that fails raises (ReportError), so the caller acts on nothing."""
    queries = idle_queries(windows_s, filters, node_label)
    answers = dict(zip(queries, await gather(*(prom.instant(q, now) for q in queries.values())),
                       strict=True))
    if node_label is None:
        _say_unnamed(answers["held"])
    return jobs_from_answers(answers, windows_s, busy_fraction, now, node_label)


def _say_unnamed(held: list[Sample]) -> None:
    """One line naming the targets whose agents name no one node: their host stands in."""
    unnamed = sorted({s.labels.get("instance", "") for s in held
                      if not s.labels.get(NODE_INFO_LABEL)})
    if unnamed:
        more = f" and {len(unnamed) - 3} more" if len(unnamed) > 3 else ""
        log.warning("the agents at %s%s name no one Slurm node in "
                    "slurm_gpu_exporter_node_info (older agents, or two nodes for a "
                    "target): their GPUs' node is taken to be the target's host; upgrade "
                    "them, or label the targets and pass --node-label",
                    ", ".join(unnamed[:3]), more)
