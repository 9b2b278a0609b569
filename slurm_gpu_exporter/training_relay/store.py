"""Per-job training series: parse what a job pushed, check it against the limits, keep it.

Pure logic, no sockets: the listener hands in (job, payload) pairs it has authenticated.
Each push carries a sender's whole current state, so a push replaces the values of
the series it names and keeps the job's others; a job's series go with ``forget``.
Thread-safe: the listener thread writes, the sampler thread reads ``families()``.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

PREFIX = "slurm_job_training_"
# Labels the agent sets; a payload's own values for them are replaced, never trusted.
IDENTITY_LABELS = ("jobid", "user")

# Why a message, connection or series was refused; each is one count in error_counts().
REASONS = (
    "refused",  # the sender's process is in no job on this node
    "connections",  # too many connections, in all or from one job
    "size",  # message over max_message_bytes or max_lines_per_message
    "rate",  # over the job's message rate
    "parse",  # not Prometheus text exposition
    "labels",  # a bad metric name, too many labels, a label name or value too long
    "type",  # a family's type clashes with the same name elsewhere
    "series",  # the job is at its series or bytes limit
)

# The families step() sends have fixed types, whatever a payload says.
WELL_KNOWN_TYPES = {
    PREFIX + "steps": "counter",
    PREFIX + "samples": "counter",
    PREFIX + "loss": "gauge",
    PREFIX + "learning_rate": "gauge",
    PREFIX + "last_step_timestamp_seconds": "gauge",
}

# Sample name suffixes each type may carry; others (`_created`, `_gsum`) are left out
# quietly: they are normal in an exposition, not an error, and not worth a series.
_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "unknown": ("",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("", "_count", "_sum"),
}
_METRIC_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# A rough per-series overhead in bytes, so the byte budget counts small series too.
_SERIES_OVERHEAD = 64


@dataclass(frozen=True)
class RelayLimits:
    """What one job may hold and send. Defaults fit a training loop with room to spare."""

    max_message_bytes: int = 65536
    max_series_per_job: int = 200  # families() costs about 2 µs a series
    max_bytes_per_job: int = 131072
    max_labels: int = 8  # besides jobid and user
    max_label_length: int = 128  # label names and values
    max_name_length: int = 128  # metric names, prefix included
    max_help_length: int = 256  # longer help text is cut, not refused
    # Per job, all its connections together. Parsing costs about 45 µs a line, so the
    # line budget is what bounds the agent's CPU under a flood.
    messages_per_second: float = 2.0
    message_burst: int = 20
    lines_per_second: float = 500.0
    line_burst: int = 5000
    max_lines_per_message: int = 2000
    max_connections: int = 512
    max_connections_per_job: int = 32
    # Per uid (SO_PEERCRED), so that one user's many jobs leave room for the others.
    max_connections_per_user: int = 128
    # Refusing a process in no job costs a look-up in /proc; a uid refused this often
    # in a second is refused without one for the rest of that second, and past the
    # global number the relay stops accepting until the second is over.
    refusals_per_user_per_second: int = 20
    max_refusals_per_second: int = 200
    # How long a connection from a job the agent has not taken in yet waits for it
    # (the agent learns of a job at its next sample); then it is refused.
    pending_seconds: float = 30.0


@dataclass(frozen=True)
class JobIdentity:
    """The job a sender was proven to run in."""

    jobid: str
    user: str


SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


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


class _Bucket:
    __slots__ = ("at", "lines", "messages")

    def __init__(self, messages: float, lines: float, at: float) -> None:
        self.messages = messages
        self.lines = lines
        self.at = at


def _series_cost(key: SeriesKey) -> int:
    return len(key[0]) + sum(len(k) + len(v) for k, v in key[1]) + _SERIES_OVERHEAD


def _shown_names(name: str, type_: str) -> tuple[str, ...]:
    """The names a family of this type shows in text and OpenMetrics exposition."""
    extra = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum",
             "_created"), "summary": ("_count", "_sum", "_created")}.get(type_, ())
    return (name, *(name + suffix for suffix in extra))


def _created_companions(families: list[Metric]) -> set[str]:
    # prometheus-client exposes `<name>_created` as a gauge family of its own.
    bases = {f.name for f in families if f.type in ("counter", "histogram", "summary")}
    return {f"{name}_created" for name in bases}


class TrainingStore:
    """The training series of the jobs on this node, bounded per job."""

    def __init__(self, limits: RelayLimits | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits or RelayLimits()
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[str, _JobSeries] = {}
        self._buckets: dict[str, _Bucket] = {}
        # name -> (type, number of jobs holding it): one type per name across jobs, so
        # the merged family stays valid exposition.
        self._types: dict[str, tuple[str, int]] = {}
        # Every name a family shows in the exposition (a counter x also x_total and
        # x_created, a histogram h also h_count...) -> the family that shows it.
        self._claims: dict[str, str] = {}
        self._errors = dict.fromkeys(REASONS, 0)
        self._accepted = 0
        # Bumped on every change to the series; families() is rebuilt only after one,
        # since scripts push less often than the agent samples.
        self._version = 0
        self._built: tuple[int, list[Metric]] = (0, [])

    # -- counts ---------------------------------------------------------------------

    def count(self, reason: str, n: int = 1) -> None:
        """Count ``n`` refusals for ``reason`` (one of REASONS)."""
        with self._lock:
            self._errors[reason] += n

    def accepted(self) -> int:
        """Messages parsed and merged so far (in part, when some series were refused)."""
        with self._lock:
            return self._accepted

    def error_counts(self) -> dict[str, int]:
        """Refusals so far, by reason (all of REASONS present)."""
        with self._lock:
            return dict(self._errors)

    # -- writing --------------------------------------------------------------------

    def admit(self, jobid: str, lines: int = 1) -> float:
        """Take a message of ``lines`` lines from the job's budgets.

        Returns 0.0, or the seconds until the budgets would have room; a refusal is
        counted under "rate".
        """
        limits = self.limits
        lines = max(1, min(lines, limits.line_burst))
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(jobid)
            if bucket is None:
                bucket = self._buckets[jobid] = _Bucket(
                    float(limits.message_burst), float(limits.line_burst), now)
            elapsed, bucket.at = now - bucket.at, now
            bucket.messages = min(float(limits.message_burst),
                                  bucket.messages + elapsed * limits.messages_per_second)
            bucket.lines = min(float(limits.line_burst),
                               bucket.lines + elapsed * limits.lines_per_second)
            if bucket.messages >= 1.0 and bucket.lines >= lines:
                bucket.messages -= 1.0
                bucket.lines -= lines
                return 0.0
            self._errors["rate"] += 1
            return max((1.0 - bucket.messages) / limits.messages_per_second,
                       (lines - bucket.lines) / limits.lines_per_second, 0.001)

    @staticmethod
    def lines_of(payload: bytes) -> int:
        """The message's lines, as the rate budget counts them."""
        return max(1, payload.count(b"\n"))

    def ingest(self, job: JobIdentity, payload: bytes) -> bool:
        """Parse one message of ``job`` and merge it in; False when it was refused whole.

        Each reason a message breaks is counted once for that message.
        """
        if (len(payload) > self.limits.max_message_bytes
                or self.lines_of(payload) > self.limits.max_lines_per_message):
            self.count("size")
            return False
        try:
            families = list(text_string_to_metric_families(payload.decode("utf-8")))
        except Exception:  # the parser raises ValueError and friends on bad text
            self.count("parse")
            return False
        reasons: set[str] = set()
        companions = _created_companions(families)
        checked = [c for c in (self._check_family(f, reasons) for f in families
                               if f.name not in companions) if c]
        with self._lock:
            self._version += 1
            store = self._jobs.get(job.jobid)
            if store is None:
                store = self._jobs[job.jobid] = _JobSeries(job)
            store.identity = job
            for name, type_, help_, samples in checked:
                self._merge(store, name, type_, help_, samples, reasons)
            if not store.families:
                del self._jobs[job.jobid]
            for reason in reasons:
                self._errors[reason] += 1
            self._accepted += 1
        return True

    def _check_family(self, family: Metric, reasons: set[str]
                      ) -> tuple[str, str, str, list[tuple[SeriesKey, float]]] | None:
        """The family renamed and its samples checked, or None when it is refused."""
        limits = self.limits
        type_ = "unknown" if family.type == "untyped" else family.type
        if type_ not in _SUFFIXES:
            reasons.add("type")
            return None
        base = family.name
        name = base if base.startswith(PREFIX) else PREFIX + base
        if len(name) > limits.max_name_length or not _METRIC_NAME_RE.fullmatch(name):
            reasons.add("labels")
            return None
        samples: list[tuple[SeriesKey, float]] = []
        for sample in family.samples:
            suffix = sample.name[len(base):] if sample.name.startswith(base) else None
            if suffix not in _SUFFIXES[type_]:
                continue
            labels = {k: v for k, v in sample.labels.items() if k not in IDENTITY_LABELS}
            if not self._labels_ok(labels, type_, suffix):
                reasons.add("labels")
                continue
            samples.append(((name + suffix, tuple(sorted(labels.items()))),
                            float(sample.value)))
        return name, type_, family.documentation[:limits.max_help_length], samples

    def _labels_ok(self, labels: dict[str, str], type_: str, suffix: str) -> bool:
        limits = self.limits
        if len(labels) > limits.max_labels:
            return False
        for key, value in labels.items():
            if (len(key) > limits.max_label_length or len(value) > limits.max_label_length
                    or key.startswith("__") or not _LABEL_NAME_RE.fullmatch(key)):
                return False
        # The bucket and quantile labels make these samples what they are.
        if type_ == "histogram" and suffix == "_bucket":
            return "le" in labels
        if type_ == "summary" and suffix == "":
            return "quantile" in labels
        return True

    def _merge(self, store: _JobSeries, name: str, type_: str, help_: str,
               samples: list[tuple[SeriesKey, float]], reasons: set[str]) -> None:
        """Under the lock: set the family's samples in the job's store, within its limits."""
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

    def forget(self, jobid: str) -> None:
        """Drop the job's series and rate budget (its linger has passed)."""
        with self._lock:
            store = self._jobs.pop(jobid, None)
            self._buckets.pop(jobid, None)
            if store is not None:
                self._version += 1
                for name in list(store.families):
                    self._drop_family(store, name)

    # -- reading --------------------------------------------------------------------

    def known_jobs(self) -> set[str]:
        """Jobs with series or a rate budget here: what ``forget`` would drop."""
        with self._lock:
            return set(self._jobs) | set(self._buckets)

    def jobs(self) -> dict[str, int]:
        """Series held per job."""
        with self._lock:
            return {jobid: store.count for jobid, store in self._jobs.items()}

    def families(self) -> list[Metric]:
        """The jobs' series as prometheus-client families, labelled with jobid and user.

        The same list is returned until the series change; callers must not modify it.
        """
        merged: dict[str, Metric] = {}
        with self._lock:
            if self._built[0] == self._version:
                return self._built[1]
            for jobid in sorted(self._jobs):
                store = self._jobs[jobid]
                identity = {"jobid": store.identity.jobid, "user": store.identity.user}
                for name, family in store.families.items():
                    metric = merged.get(name)
                    if metric is None:
                        metric = merged[name] = Metric(name, family.help, family.type)
                    for (sample_name, labels), value in family.series.items():
                        metric.add_sample(sample_name, {**identity, **dict(labels)}, value)
            self._built = (self._version, [merged[name] for name in sorted(merged)])
            return self._built[1]

