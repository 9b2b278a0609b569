"""What a push may say: its families renamed under the training prefix, their samples'
names and labels checked against the limits. Pure functions, no state."""

from __future__ import annotations

import re

from prometheus_client.metrics_core import Metric

from slurm_gpu_exporter.exposition.metrics import JOB_MLFLOW_RUN_INFO
from slurm_gpu_exporter.training_relay.limits import RelayLimits

PREFIX = "slurm_job_training_"
# What the client pushes for its MLflow runs; shown as JOB_MLFLOW_RUN_INFO, its labels
# held to MLflow's own id shapes (run ids are uuid4 hex, experiment ids are numbers).
MLFLOW_RUN_PUSHED = PREFIX + "mlflow_run_info"
MLFLOW_RUN_LABELS = frozenset({"run_id", "experiment_id"})
MAX_MLFLOW_RUNS = 16
_RUN_ID_RE = re.compile(r"[0-9a-f]{32}")
_EXPERIMENT_ID_RE = re.compile(r"0|[1-9][0-9]{0,18}")
# Labels the agent sets; a payload's own values for them are replaced, never trusted.
IDENTITY_LABELS = ("jobid", "user")

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

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]
# A family as the store merges it: name, type, help, and its samples' keys and values.
CheckedFamily = tuple[str, str, str, list[tuple[SeriesKey, float]]]


def lines_of(payload: bytes) -> int:
    """The message's lines, as the rate budget counts them."""
    return max(1, payload.count(b"\n"))


def created_companions(families: list[Metric]) -> set[str]:
    """The ``<name>_created`` families that only accompany the others."""
    # prometheus-client exposes `<name>_created` as a gauge family of its own.
    bases = {f.name for f in families if f.type in ("counter", "histogram", "summary")}
    return {f"{name}_created" for name in bases}


def check_family(family: Metric, limits: RelayLimits, reasons: set[str]
                 ) -> CheckedFamily | None:
    """The family renamed and its samples checked, or None when it is refused; each
    reason for a refusal, of the family or of a sample, is added to ``reasons``."""
    type_ = "unknown" if family.type == "untyped" else family.type
    if type_ not in _SUFFIXES:
        reasons.add("type")
        return None
    base = family.name
    name = base if base.startswith(PREFIX) else PREFIX + base
    if len(name) > limits.max_name_length or not _METRIC_NAME_RE.fullmatch(name):
        reasons.add("labels")
        return None
    if name == MLFLOW_RUN_PUSHED:
        return _mlflow_runs(family, type_, reasons)
    samples: list[tuple[SeriesKey, float]] = []
    for sample in family.samples:
        suffix = sample.name[len(base):] if sample.name.startswith(base) else None
        if suffix not in _SUFFIXES[type_]:
            continue
        labels = {k: v for k, v in sample.labels.items() if k not in IDENTITY_LABELS}
        if not _labels_ok(labels, limits, type_, suffix):
            reasons.add("labels")
            continue
        samples.append(((name + suffix, tuple(sorted(labels.items()))),
                        float(sample.value)))
    return name, type_, family.documentation[:limits.max_help_length], samples


def _labels_ok(labels: dict[str, str], limits: RelayLimits, type_: str, suffix: str
               ) -> bool:
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


def _mlflow_runs(family: Metric, type_: str, reasons: set[str]) -> CheckedFamily | None:
    """The pushed MLflow runs as ``JOB_MLFLOW_RUN_INFO``: a gauge of value 1 whose
    labels are exactly a run id and an experiment id of MLflow's shapes."""
    if type_ not in ("gauge", "unknown"):
        reasons.add("type")
        return None
    samples: list[tuple[SeriesKey, float]] = []
    for sample in family.samples:
        if sample.name != family.name:
            continue
        labels = {k: v for k, v in sample.labels.items() if k not in IDENTITY_LABELS}
        if (labels.keys() != MLFLOW_RUN_LABELS or sample.value != 1
                or not _RUN_ID_RE.fullmatch(labels["run_id"])
                or not _EXPERIMENT_ID_RE.fullmatch(labels["experiment_id"])):
            reasons.add("labels")
            continue
        if len(samples) >= MAX_MLFLOW_RUNS:
            reasons.add("series")
            break
        samples.append(((JOB_MLFLOW_RUN_INFO, tuple(sorted(labels.items()))), 1.0))
    return (JOB_MLFLOW_RUN_INFO, "gauge", "MLflow runs the job's script had active; value "
            "is always 1.", samples)
