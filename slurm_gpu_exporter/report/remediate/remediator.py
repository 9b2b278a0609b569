"""Which alert drains which node: ``Remediator`` turns the alerts of a webhook post into
drains, or into refusals that say why.

An alert acts only when all of these hold, checked in this order: it is among the first
``max_alerts`` of its post; it is firing and in the allow-list; its node label is a
plain host name; Prometheus shows the same alert firing now for the same node label
value (``confirm.py``); one of those firing episodes (the series and its active-since
time, as Prometheus has them: never the post's fingerprint, start or extra labels) was
not acted on before (``memory.py``); Slurm lists a node under exactly that name (never
``ALL``, a NodeSet or a name it does not know); the node is not drained already (an
admin's reason is kept); and the drain budget of the window is not spent. The alerts of
a post are grouped by node: one Slurm look-up and at most one drain per node. Nothing
here ever resumes a node. The reason Slurm records is made from what Prometheus shows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.inert_text import plain, slurm_value
from slurm_gpu_exporter.report.prometheus.nodes import node_name
from slurm_gpu_exporter.report.remediate.budget import DrainBudget
from slurm_gpu_exporter.report.remediate.confirm import TARGET_LABEL, Episode, Fault, Firing
from slurm_gpu_exporter.report.remediate.memory import ActedOn
from slurm_gpu_exporter.report.slurm.actions import (
    SlurmNode,
    drain_node,
    is_node_name,
    listed_node,
)

log = logging.getLogger(__name__)

DEFAULT_ALERTS = ("SlurmGpuLost", "SlurmGpuXidResetRequired", "SlurmGpuEccUncorrected")
DEFAULT_MAX_ALERTS = 1000  # alerts per post; Alertmanager groups by node, so a few


@dataclass(frozen=True)
class Outcome:
    """What was done with one alert: a counter's labels and the words of the answer."""

    outcome: str  # drained, dry_run, ignored, refused, failed
    reason: str  # a short fixed word, for the counter
    text: str
    # On the first outcome of a node drained (or found drained) for new firings: what
    # the jobs on the faulty GPU are signalled for (``requeuer.py``).
    fault: Fault | None = None


@dataclass
class _Node:
    """The confirmed alerts of one post for one node, and their episodes."""

    name: str
    indexes: list[int] = field(default_factory=list)
    episodes: dict[Episode, str] = field(default_factory=dict)  # -> its alert name


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
    acted_on: ActedOn = field(default_factory=lambda: ActedOn(None))
    max_alerts: int = DEFAULT_MAX_ALERTS
    # Told of a fault before its episodes are remembered (the requeue book opens them,
    # so that a crash after the drain leaves their requeue work to the next post).
    opening: Callable[[Fault, float], None] = lambda fault, now: None

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
        # A target's host is screened too; the node its agent names is checked once known.
        if not is_node_name(node_name(str(labels.get(self.label, "")))):
            return self._refused("not_a_node", "not a node name", alert)
        return None

    @property
    def label(self) -> str:
        """The alert label that names the node or its target."""
        return self.node_label or TARGET_LABEL

    def needs_prometheus(self, alerts: list[dict[str, Any]]) -> bool:
        """Whether an alert of the post (within the cap) is to be confirmed."""
        return any(self.screen(a) is None for a in alerts[:self.max_alerts])

    def handle(self, alert: dict[str, Any], firing: Firing | None) -> Outcome:
        """One alert alone: ``decide`` for a post of one."""
        return self.decide([alert], firing)[0]

    def decide(self, alerts: list[dict[str, Any]], firing: Firing | None) -> list[Outcome]:
        """Each alert's outcome, given what Prometheus has firing now (None: it could not
        be asked); acts once per node, logs where it acted or refused."""
        out: list[Outcome | None] = [None] * len(alerts)
        if len(alerts) > self.max_alerts:
            excess = len(alerts) - self.max_alerts
            log.warning("refused %d alerts past the first %d of one post (--max-alerts-per-"
                        "post): Alertmanager groups alerts by node, a post this big is a "
                        "flood or forged", excess, self.max_alerts)
            for i in range(self.max_alerts, len(alerts)):
                out[i] = Outcome("refused", "post_cap",
                                 f"refused: more than {self.max_alerts} alerts in one post")
        nodes: dict[str, _Node] = {}
        for i, alert in enumerate(alerts[:self.max_alerts]):
            out[i] = self.screen(alert) or self._confirm(alert, firing, i, nodes)
        for node in nodes.values():
            outcomes = self._act(node)
            for i, outcome in zip(node.indexes, outcomes, strict=True):
                out[i] = outcome
        return [o for o in out if o is not None]

    def _confirm(self, alert: dict[str, Any], firing: Firing | None, i: int,
                 nodes: dict[str, _Node]) -> Outcome | None:
        """A refusal, or None with the alert's episodes added to its node's."""
        labels = alert["labels"]
        name, value = str(labels["alertname"]), str(labels[self.label])
        if firing is None:
            return self._refused("prometheus_unavailable", "cannot confirm the alert: "
                                 "Prometheus did not answer", alert)
        episodes = firing.get((name, value))
        if not episodes:
            return self._refused("unconfirmed", f"Prometheus shows no firing {name} for "
                                 f"{self.label}={value}", alert)
        # The node the target's agent names (joined in by confirm.py), else its host.
        named = "" if self.node_label else next((e.node for e in episodes if e.node), "")
        host = named or node_name(value)
        if not is_node_name(host):
            return self._refused("not_a_node", f"{host} is not a node name", alert)
        node = nodes.setdefault(host, _Node(host))
        node.indexes.append(i)
        node.episodes.update((e, name) for e in episodes)
        return None

    def _act(self, node: _Node) -> list[Outcome]:
        """The outcomes of one node's confirmed alerts: one drain at most."""
        now = self.clock()
        count = len(node.indexes)
        new = [e for e in node.episodes if e not in self.acted_on]
        if not new:
            self.acted_on.heard_of(node.episodes, now)
            since = ", ".join(sorted({f"{n} since {e.since_text}"
                                      for e, n in node.episodes.items()}))
            log.info("ignored %d alert(s) for %s: acted on this firing before (%s); a "
                     "new firing drains again", count, node.name, plain(since, 300))
            ignored = Outcome("ignored", "same_episode", "ignored: acted on this firing "
                              f"of the alert before ({plain(since, 300)})")
            # The requeue work a failure left open is tried again on a repeat.
            repeat = Fault(node.name, _ordered(node, node.episodes), repeat=True)
            return [replace(ignored, fault=repeat)] + [ignored] * (count - 1)
        try:
            listed = self.lookup(node.name)
            if listed is None:
                return self._refused_node(node, "unknown_node",
                                          f"Slurm lists no node named {node.name}")
            fault = Fault(node.name, _ordered(node, new))
            if "DRAIN" in listed.state.upper():
                self._remember(node, now, fault)
                ignored = Outcome("ignored", "already_drained",
                                  f"ignored: {node.name} is already {plain(listed.state)}")
                return [replace(ignored, fault=fault)] + [ignored] * (count - 1)
            if not self.budget.allows(now):
                return self._refused_node(
                    node, "drain_cap", f"{self.budget.max_drains} drains in the last "
                    f"{self.budget.window_s:g} s already (--max-drains); drain {node.name} "
                    "by hand if it needs it")
            # The newest new episode names the fault (its own labels and start).
            episode = max(new, key=lambda e: (e.since, e.labels))
            reason = _reason(node.episodes[episode], episode)
            if self.dry_run:
                self.budget.spend(now)
                self._remember(node, now, fault)
                log.info("dry run: would drain %s: %s", node.name, reason)
                return self._first_and_rest(node, Outcome(
                    "dry_run", "dry_run", f"dry run: would drain {node.name}", fault))
            self.drain(node.name, reason)
            self.budget.spend(now)
        except ReportError as exc:
            log.error("cannot drain %s: %s", node.name, plain(exc))
            return [Outcome("failed", "slurm", f"failed: {plain(exc)}")] * count
        self._remember(node, now, fault)
        log.info("drained %s: %s", node.name, reason)
        return self._first_and_rest(node, Outcome("drained", "drained",
                                                  f"drained {node.name}", fault))

    def _remember(self, node: _Node, now: float, fault: Fault) -> None:
        self.opening(fault, now)
        self.acted_on.remember(node.episodes, now)

    @staticmethod
    def _first_and_rest(node: _Node, first: Outcome) -> list[Outcome]:
        """The drain goes to the first alert; the others of the node came with it."""
        rest = Outcome("ignored", "same_drain",
                       f"ignored: {node.name} drained for another alert of this post")
        return [first] + [rest] * (len(node.indexes) - 1)

    def _refused_node(self, node: _Node, reason: str, why: str) -> list[Outcome]:
        names = ", ".join(sorted(set(node.episodes.values())))
        log.warning("refused %s (node %s): %s", plain(names, 200), node.name,
                    plain(why, 300))
        return [Outcome("refused", reason, f"refused: {plain(why, 300)}")] * len(node.indexes)

    def _refused(self, reason: str, why: str, alert: dict[str, Any]) -> Outcome:
        labels = alert.get("labels", {})
        why = plain(why, 300)
        log.warning("refused %s (%s=%s): %s", plain(labels.get("alertname", "?"), 100),
                    self.label, plain(labels.get(self.label, ""), 200), why)
        return Outcome("refused", reason, f"refused: {why}")


def _ordered(node: _Node, episodes: Iterable[Episode]) -> tuple[tuple[Episode, str], ...]:
    """The episodes, oldest first, each with its alert name."""
    return tuple((e, node.episodes[e]) for e in sorted(episodes,
                                                        key=lambda e: (e.since, e.labels)))


def _reason(name: str, episode: Episode) -> str:
    """What Slurm records: the alert as Prometheus has it, and when it became active."""
    return slurm_value(f"slurm-gpu-exporter {name} gpu {episode.label('gpu', '?')} "
                       f"{episode.label('uuid')} xid {episode.label('xid', '-')} since "
                       f"{episode.since_text}")
