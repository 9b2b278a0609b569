"""The training series of the jobs on this node: each job's families within its series
and byte limits, and one type per exposed name across jobs, so that the families merged
for the exposition stay valid."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.metrics_core import Metric

from slurm_gpu_exporter.exposition.metrics import JOB_MLFLOW_RUN_INFO
from slurm_gpu_exporter.training_relay.limits import RelayLimits
from slurm_gpu_exporter.training_relay.payload import PREFIX, CheckedFamily, SeriesKey

# The families step() sends have fixed types, whatever a payload says.
WELL_KNOWN_TYPES = {
    PREFIX + "steps": "counter",
    PREFIX + "samples": "counter",
    PREFIX + "loss": "gauge",
    PREFIX + "learning_rate": "gauge",
    PREFIX + "last_step_timestamp_seconds": "gauge",
    JOB_MLFLOW_RUN_INFO: "gauge",
}
# A rough per-series overhead in bytes, so the byte budget counts small series too.
_SERIES_OVERHEAD = 64


@dataclass(frozen=True)
class JobIdentity:
    """The job a sender was proven to run in."""

    jobid: str
    user: str


class _Family:
    __slots__ = ("help", "series", "type")

    def __init__(self, type_: str, help_: str) -> None:
        self.type = type_
        self.help = help_
        self.series: dict[SeriesKey, float] = {}


class _JobSeries:
    __slots__ = ("bytes", "count", "families", "identity")

    def __init__(self, identity: JobIdentity) -> None:
        self.identity = identity
        self.families: dict[str, _Family] = {}
        self.count = 0
        self.bytes = 0


def _series_cost(key: SeriesKey) -> int:
    return len(key[0]) + sum(len(k) + len(v) for k, v in key[1]) + _SERIES_OVERHEAD


def _shown_names(name: str, type_: str) -> tuple[str, ...]:
    """The names a family of this type shows in text and OpenMetrics exposition."""
    extra = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum",
             "_created"), "summary": ("_count", "_sum", "_created")}.get(type_, ())
    return (name, *(name + suffix for suffix in extra))


class SeriesBook:
    """Every job's series, and which family shows each name. Not locked: the store
    calls it under its own lock."""

    def __init__(self, limits: RelayLimits) -> None:
        self.limits = limits
        self._jobs: dict[str, _JobSeries] = {}
        # name -> (type, number of jobs holding it): one type per name across jobs, so
        # the merged family stays valid exposition.
        self._types: dict[str, tuple[str, int]] = {}
        # Every name a family shows in the exposition (a counter x also x_total and
        # x_created, a histogram h also h_count...) -> the family that shows it.
        self._claims: dict[str, str] = {}

    def merge(self, job: JobIdentity, checked: list[CheckedFamily], reasons: set[str]
              ) -> None:
        """Set the checked families' samples in the job's series, within its limits;
        what is refused adds its reason to ``reasons``."""
        store = self._jobs.get(job.jobid)
        if store is None:
            store = self._jobs[job.jobid] = _JobSeries(job)
        store.identity = job
        for name, type_, help_, samples in checked:
            self._merge(store, name, type_, help_, samples, reasons)
        if not store.families:
            del self._jobs[job.jobid]

    def _merge(self, store: _JobSeries, name: str, type_: str, help_: str,
               samples: list[tuple[SeriesKey, float]], reasons: set[str]) -> None:
        """Set the family's samples in the job's store, within its limits."""
        limits = self.limits
        family = store.families.get(name)
        if family is not None and family.type != type_:
            self._drop_family(store, name)  # the job changed its mind: its latest word
            family = None
        if family is None:
            held = self._types.get(name)
            fixed = WELL_KNOWN_TYPES.get(name) or (held[0] if held else None)
            if fixed == "gauge" and type_ == "unknown":
                type_ = "gauge"  # an untyped line for a gauge's name: it is that gauge
            if fixed is not None and fixed != type_:
                reasons.add("type")
                return
            shown = _shown_names(name, type_)
            if any(self._claims.get(n, name) != name for n in shown):
                reasons.add("type")  # another family shows one of these names already
                return
            family = store.families[name] = _Family(type_, help_)
            self._types[name] = (type_, (held[1] if held else 0) + 1)
            for shown_name in shown:
                self._claims[shown_name] = name
        family.help = help_
        for key, value in samples:
            if key in family.series:
                family.series[key] = value
                continue
            cost = _series_cost(key)
            if (store.count >= limits.max_series_per_job
                    or store.bytes + cost > limits.max_bytes_per_job):
                reasons.add("series")
                continue
            family.series[key] = value
            store.count += 1
            store.bytes += cost
        if not family.series:
            self._drop_family(store, name)

    def _drop_family(self, store: _JobSeries, name: str) -> None:
        family = store.families.pop(name)
        store.count -= len(family.series)
        store.bytes -= sum(_series_cost(key) for key in family.series)
        type_, holders = self._types[name]
        if holders <= 1:
            del self._types[name]
            for shown_name in _shown_names(name, type_):
                self._claims.pop(shown_name, None)
        else:
            self._types[name] = (type_, holders - 1)

    def forget(self, jobid: str) -> bool:
        """Drop the job's series; whether it had any."""
        store = self._jobs.pop(jobid, None)
        if store is None:
            return False
        for name in list(store.families):
            self._drop_family(store, name)
        return True

    def jobs(self) -> dict[str, int]:
        """Series held per job."""
        return {jobid: store.count for jobid, store in self._jobs.items()}

    def families(self) -> list[Metric]:
        """The jobs' series as prometheus-client families, labelled with jobid and user."""
        merged: dict[str, Metric] = {}
        for jobid in sorted(self._jobs):
            store = self._jobs[jobid]
            identity = {"jobid": store.identity.jobid, "user": store.identity.user}
            for name, family in store.families.items():
                metric = merged.get(name)
                if metric is None:
                    metric = merged[name] = Metric(name, family.help, family.type)
                for (sample_name, labels), value in family.series.items():
                    metric.add_sample(sample_name, {**identity, **dict(labels)}, value)
        return [merged[name] for name in sorted(merged)]
