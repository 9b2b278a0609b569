"""bounded_label_value: valid UTF-8, at most MAX_LABEL_VALUE_CHARS characters."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest

from slurm_gpu_exporter.exposition.labels import (
    MAX_LABEL_VALUE_CHARS,
    bound_label_values,
    bounded_label_value,
)


def test_short_values_are_unchanged() -> None:
    for value in ("", "alice", 'q"uote\\n\n', "ünï 🚀"):
        assert bounded_label_value(value) == value


def test_long_values_are_cut_and_surrogates_replaced() -> None:
    assert bounded_label_value("é" * 10_000) == "é" * MAX_LABEL_VALUE_CHARS
    assert bounded_label_value("a\udcffb\ud800") == "a\ufffdb\ufffd"


def test_a_family_with_a_lone_surrogate_can_be_rendered() -> None:
    family = GaugeMetricFamily("x", "doc", labels=["user"])
    family.add_metric(["bad\udcff" + "y" * 1000], 1)

    class One:
        def collect(self) -> list[GaugeMetricFamily]:
            return [bound_label_values(family)]

    text = generate_latest(One()).decode()  # type: ignore[arg-type]
    assert 'user="bad\ufffd' + "y" * (MAX_LABEL_VALUE_CHARS - 4) + '"' in text
