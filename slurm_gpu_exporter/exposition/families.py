"""What every metrics module of the agent builds its families with: the label sets and
the family makers (exposition/metrics.py, exposition/gpu_metrics.py)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

JOB_LABELS = ["jobid", "user"]
JOB_GPU_LABELS = ["jobid", "user", "gpu", "uuid"]
GPU_LABELS = ["gpu", "uuid"]
INFO_LABELS = ["jobid", "user", "uid", "account", "partition", "qos", "name", "array_job_id",
               "array_task_id", "source"]


def _gauge(name: str, doc: str, labels: list[str], unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels, unit=unit)


def _counter(name: str, doc: str, labels: list[str], unit: str = "") -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels, unit=unit)


def _maybe(family: GaugeMetricFamily | CounterMetricFamily, labels: list[str],
           value: float | None) -> None:
    """Add a sample only when the value is known: an unknown value is an absent series."""
    if value is not None:
        family.add_metric(labels, value)
