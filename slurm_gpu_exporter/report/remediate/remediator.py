"""Which alert drains which node: ``Remediator`` turns each alert of a webhook post into
a drain, or into a refusal that says why.

An alert acts only when all of these hold, checked in this order: it is firing and in
the allow-list; it was not acted on before (by its fingerprint and start); its node
label is a plain host name; Prometheus shows the same alert firing now for the same
node label value (``confirm.py``); Slurm lists a node under exactly that name (never
``ALL``, a NodeSet or a name it does not know); the node is not drained already (an
admin's reason is kept); and the drain budget of the window is not spent. Nothing here
ever resumes a node. The reason Slurm records is made from the labels Prometheus gave,
not from the post.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.inert_text import plain, slurm_value
from slurm_gpu_exporter.report.prometheus.nodes import NODE_INFO_LABEL, node_name
from slurm_gpu_exporter.report.remediate.budget import DrainBudget
from slurm_gpu_exporter.report.remediate.confirm import TARGET_LABEL, Firing
from slurm_gpu_exporter.report.slurm.actions import (
    SlurmNode,
    drain_node,
    is_node_name,
    listed_node,
)

log = logging.getLogger(__name__)

DEFAULT_ALERTS = ("SlurmGpuLost", "SlurmGpuXidResetRequired", "SlurmGpuEccUncorrected")
REMEMBERED_ALERTS = 10_000  # alerts acted on, kept to act once each (oldest forgotten)


@dataclass(frozen=True)
class Outcome:
    """What was done with one alert: a counter's labels and the words of the answer."""

    outcome: str  # drained, dry_run, ignored, refused, failed
    reason: str  # a short fixed word, for the counter
    text: str


@dataclass
class Remediator:
    """Turns the alerts of one webhook post into drains."""

    allowed: frozenset[str] = frozenset(DEFAULT_ALERTS)
    # A site's label naming the node; None: the alert's target, and the node its agent
    # names in Prometheus (confirm.py), else the target's host.
    node_label: str | None = None
    dry_run: bool = False
    budget: DrainBudget = field(default_factory=DrainBudget)
    drain: Callable[[str, str], None] = drain_node
    lookup: Callable[[str], SlurmNode | None] = listed_node
    clock: Callable[[], float] = time.time
    _done: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def screen(self, alert: dict[str, Any]) -> Outcome | None:
        """The outcome of an alert that needs no one asked, or None: ask Prometheus."""
        labels = alert.get("labels")
        if not isinstance(labels, dict):
            return Outcome("ignored", "no_labels", "ignored: no labels")
        if alert.get("status") != "firing":
            return Outcome("ignored", "not_firing",
                           "ignored: not firing (remediate never resumes a node)")
        if str(labels.get("alertname", "")) not in self.allowed:
            return Outcome("ignored", "not_allowed", "ignored: alert not in the allow-list")
        if _key(alert) in self._done:
            return Outcome("ignored", "repeat", "ignored: acted on this alert before")
        # A target's host is screened too; the node its agent names is checked in handle.
        if not is_node_name(node_name(str(labels.get(self.label, "")))):
            return self._refused("not_a_node", "not a node name", alert)
        return None

    @property
    def label(self) -> str:
        """The alert label that names the node or its target."""
        return self.node_label or TARGET_LABEL

    def handle(self, alert: dict[str, Any], firing: Firing | None) -> Outcome:
        """Act on one alert, given what Prometheus has firing now (None: it could not be
        asked); the outcome, logged where it acted or refused."""
        screened = self.screen(alert)
        if screened is not None:
            return screened
        labels = alert["labels"]
        name, value = str(labels["alertname"]), str(labels[self.label])
        if firing is None:
            return self._refused("prometheus_unavailable", "cannot confirm the alert: "
                                 "Prometheus did not answer", alert)
        confirmed = firing.get((name, value))
        if confirmed is None:
            return self._refused("unconfirmed", f"Prometheus shows no firing {name} for "
                                 f"{self.label}={value}", alert)
        # The node the target's agent names (confirm.py joined it in), else its host.
        node = (None if self.node_label else confirmed.get(NODE_INFO_LABEL)) or node_name(value)
        if not is_node_name(node):
            return self._refused("not_a_node", f"{node} is not a node name", alert)
        try:
            listed = self.lookup(node)
            if listed is None:
                return self._refused("unknown_node", f"Slurm lists no node named {node}",
                                     alert)
            if "DRAIN" in listed.state.upper():
                self._remember(_key(alert))
                return Outcome("ignored", "already_drained",
                               f"ignored: {node} is already {plain(listed.state)}")
            now = self.clock()
            if not self.budget.allows(now):
                return self._refused("drain_cap", f"{self.budget.max_drains} drains in the "
                                     f"last {self.budget.window_s:g} s already (--max-drains);"
                                     f" drain {node} by hand if it needs it", alert)
            reason = _reason(name, confirmed, alert)
            if self.dry_run:
                self.budget.spend(now)
                log.info("dry run: would drain %s: %s", node, reason)
                return Outcome("dry_run", "dry_run", f"dry run: would drain {node}")
            self.drain(node, reason)
            self.budget.spend(now)
        except ReportError as exc:
            log.error("cannot drain %s for %s: %s", node, name, plain(exc))
            return Outcome("failed", "slurm", f"failed: {plain(exc)}")
        self._remember(_key(alert))
        log.info("drained %s: %s", node, reason)
        return Outcome("drained", "drained", f"drained {node}")

    def _refused(self, reason: str, why: str, alert: dict[str, Any]) -> Outcome:
        labels = alert.get("labels", {})
        why = plain(why, 300)
        log.warning("refused %s (%s=%s): %s", plain(labels.get("alertname", "?"), 100),
                    self.label, plain(labels.get(self.label, ""), 200), why)
        return Outcome("refused", reason, f"refused: {why}")

    def _remember(self, key: str) -> None:
        self._done[key] = None
        while len(self._done) > REMEMBERED_ALERTS:
            self._done.popitem(last=False)


def _key(alert: dict[str, Any]) -> str:
    return str(alert.get("fingerprint") or json.dumps(alert.get("labels"), sort_keys=True)) \
        + "@" + str(alert.get("startsAt", ""))


def _reason(name: str, confirmed: dict[str, str], alert: dict[str, Any]) -> str:
    """What Slurm records: the alert as Prometheus has it, and when it started."""
    return slurm_value(f"slurm-gpu-exporter {name} gpu {confirmed.get('gpu', '?')} "
                       f"{confirmed.get('uuid', '')} xid {confirmed.get('xid', '-')} since "
                       f"{alert.get('startsAt', '?')}")
