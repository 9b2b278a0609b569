"""Asking Prometheus which GPU alerts fire now, and since when: the second source
``remediate`` needs.

Alertmanager takes alerts from anyone who can reach its API, so a webhook post proves
nothing alone. Prometheus keeps, for every alert its rules hold, the series
``ALERTS{alertstate="firing", alertname=…, <labels>…}`` (value 1) and
``ALERTS_FOR_STATE{alertname=…, <labels>…}`` whose value is the time the alert became
active (Unix seconds). That time stays the same while the alert fires, also through
``keep_firing_for``, and is new once the alert resolved and fires again: it names one
firing episode. An alert in a post acts only where Prometheus shows the same alert name
firing now for the same node label value. One query per post, whatever the number of
alerts in it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from slurm_gpu_exporter.report.prometheus.client import PrometheusClient
from slurm_gpu_exporter.report.prometheus.nodes import NODE_INFO, NODE_INFO_LABEL, join_node
from slurm_gpu_exporter.report.prometheus.queries import selector

ALERT_NAME_RE = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
# Labels of the series that are not the alert's own: the metric name, the state, and
# the node joined in from the agent (an agent upgraded mid-firing is the same firing).
_NOT_IDENTIFYING = frozenset({"__name__", "alertstate", NODE_INFO_LABEL})
# The label an alert names its target by, where the site gives no --node-label.
TARGET_LABEL = "instance"
# How far back an agent's node info still names its target's node: an alert fires
# from series at most ~10m old (keep_firing_for included).
NODE_INFO_LOOKBACK = "15m"


@dataclass(frozen=True)
class Episode:
    """One firing of one alert series, as Prometheus knows it: the series' labels (the
    rule's own, never a post's) and when it became active."""

    labels: tuple[tuple[str, str], ...]
    since: float
    # The Slurm node the target's agent names ('' where none): not part of the identity.
    node: str = field(default="", compare=False)

    @classmethod
    def of(cls, labels: dict[str, str], since: float) -> Episode:
        return cls(tuple(sorted((k, v) for k, v in labels.items()
                                if k not in _NOT_IDENTIFYING)), since,
                   labels.get(NODE_INFO_LABEL, ""))

    def label(self, name: str, default: str = "") -> str:
        return dict(self.labels).get(name, default)

    @property
    def since_text(self) -> str:
        """The active-since time, RFC 3339 in UTC to the second."""
        return datetime.fromtimestamp(self.since, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Fault:
    """New firing episodes of a node that remediate drained (or found drained): what
    the jobs holding the faulty GPU are signalled and requeued for. ``repeat``: the
    episodes were acted on before (a repeat of the post); the requeue work of the ones
    it left open (a failed look-up) is tried again, the others are done."""

    node: str
    episodes: tuple[tuple[Episode, str], ...]  # each with its alert name
    repeat: bool = False


# (alert name, node label value) -> the firing episodes of that alert there.
Firing = dict[tuple[str, str], list[Episode]]


def firing_query(names: Iterable[str]) -> str:
    """The active-since times of the allow-listed alerts that fire now:
    ``ALERTS_FOR_STATE{…} and ignoring(alertstate) ALERTS{alertstate="firing", …}`` (a
    pending alert has ALERTS_FOR_STATE too, so the firing ones are picked by ALERTS)."""
    alternation = "|".join(sorted(re.escape(n) for n in names))
    state = selector("ALERTS_FOR_STATE", {}, {"alertname": alternation})
    firing = selector("ALERTS", {"alertstate": "firing"}, {"alertname": alternation})
    return f"{state} and ignoring(alertstate) {firing}"


async def firing_alerts(prom: PrometheusClient, names: Iterable[str], node_label: str | None,
                        now: float | None = None) -> Firing:
    """The allow-listed alerts firing now, by name and node label value (``instance``
    without a ``node_label``: then each episode carries the node its target's agent
    names, where it names one), each with its episodes; a ReportError when Prometheus
    cannot say (then nothing is confirmed)."""
    query = firing_query(names)
    if node_label is None:
        query = join_node(query, (TARGET_LABEL,), NODE_INFO, NODE_INFO_LOOKBACK)
    samples = await prom.instant(query, time.time() if now is None else now)
    firing: Firing = {}
    for sample in samples:
        node = sample.labels.get(node_label or TARGET_LABEL)
        if node and sample.value == sample.value:  # NaN is no time
            key = (sample.labels.get("alertname", ""), node)
            firing.setdefault(key, []).append(Episode.of(sample.labels, sample.value))
    return firing
