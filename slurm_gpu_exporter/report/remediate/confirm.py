"""Asking Prometheus which GPU alerts fire now: the second source ``remediate`` needs.

Alertmanager takes alerts from anyone who can reach its API, so a webhook post proves
nothing alone. Prometheus keeps every alert its rules fire as the series
``ALERTS{alertstate="firing", alertname=…, <labels>…}``; an alert in a post acts only
where that series is there now with the same alert name and the same node label value.
One query per post, whatever the number of alerts in it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable

from slurm_gpu_exporter.report.prometheus.client import PrometheusClient
from slurm_gpu_exporter.report.prometheus.nodes import NODE_INFO, join_node
from slurm_gpu_exporter.report.prometheus.queries import selector

# (alert name, node label value) -> the labels of the firing series.
Firing = dict[tuple[str, str], dict[str, str]]
ALERT_NAME_RE = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
# The label an alert names its target by, where the site gives no --node-label.
TARGET_LABEL = "instance"
# How far back an agent's node info still names its target's node: an alert fires
# from series at most ~10m old (keep_firing_for included).
NODE_INFO_LOOKBACK = "15m"


def firing_query(names: Iterable[str]) -> str:
    """``ALERTS{alertstate="firing", alertname=~"A|B"}`` for the allow-listed alerts."""
    alternation = "|".join(sorted(re.escape(n) for n in names))
    return selector("ALERTS", {"alertstate": "firing"}, {"alertname": alternation})


async def firing_alerts(prom: PrometheusClient, names: Iterable[str], node_label: str | None,
                        now: float | None = None) -> Firing:
    """The allow-listed alerts firing now, by name and node label value (``instance``
    without a ``node_label``: then each carries the ``slurm_node`` its target's agent
    names, where it names one); a ReportError when Prometheus cannot say (then nothing
    is confirmed)."""
    query = firing_query(names)
    if node_label is None:
        query = join_node(query, (TARGET_LABEL,), NODE_INFO, NODE_INFO_LOOKBACK)
    samples = await prom.instant(query, time.time() if now is None else now)
    firing: Firing = {}
    for sample in samples:
        node = sample.labels.get(node_label or TARGET_LABEL)
        if node:
            firing.setdefault((sample.labels.get("alertname", ""), node), sample.labels)
    return firing
