"""Which Slurm node a series is from, whatever Prometheus names its scrape target.

A target may be a short host name (``gpu01:9817``), an FQDN or an IP: only the first
is Slurm's node name. Each agent publishes the name Slurm knows it by in
``slurm_gpu_exporter_node_info{slurm_node=…}``; the queries that need a node join it in
by target (``join_node``), and the tools read the node through ``series_node``:

1. a site's own label where ``--node-label`` names one (port dropped), else
2. ``slurm_node``, joined from the target's agent, else
3. the target's host: an agent too old to publish the info series.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from slurm_gpu_exporter.report.prometheus.client import Sample

NODE_INFO = "slurm_gpu_exporter_node_info"
NODE_INFO_LABEL = "slurm_node"


def node_name(instance: str) -> str:
    """``gpu01:9400`` -> ``gpu01`` (an IPv6 ``[::1]:9400`` keeps its brackets)."""
    host, sep, port = instance.rpartition(":")
    return host if sep and port.isdigit() and host else instance


def node_map(on: Sequence[str], info: str, lookback: str) -> str:
    """One series per target (the ``on`` labels) whose ``slurm_node`` is the node its
    agent named over ``lookback``, from the selector ``info``. A target that named two
    nodes there is left out: a guess could put one node's GPUs on another."""
    by = ", ".join(on)
    named = f"max by ({by}, {NODE_INFO_LABEL}) (last_over_time({info}[{lookback}]))"
    return f"({named} and on ({by}) (count by ({by}) ({named}) == 1))"


def join_node(expr: str, on: Sequence[str], info: str, lookback: str) -> str:
    """``expr``'s series with the ``slurm_node`` label of their target joined in. A
    series whose target names no node (an older agent) is kept as it is, without it."""
    by = ", ".join(on)
    return (f"(({expr}) * on ({by}) group_left ({NODE_INFO_LABEL}) "
            f"{node_map(on, info, lookback)}) or ignoring ({NODE_INFO_LABEL}) ({expr})")


def series_node(labels: dict[str, str], node_label: str | None = None) -> str:
    """The Slurm node a series is from: its ``node_label`` label where a site names one
    (port dropped), else the node its agent names, else its target's host."""
    instance = labels.get("instance", "")
    if node_label:
        return node_name(labels.get(node_label, instance))
    return labels.get(NODE_INFO_LABEL) or node_name(instance)


def shown_nodes(samples: Iterable[Sample], node_label: str | None = None) -> dict[str, str]:
    """The node a report shows for each target (``instance``) of these series; the
    target itself where two targets give one node (several agents on a host: tests)."""
    node_of = {s.labels.get("instance", ""): series_node(s.labels, node_label)
               for s in samples}
    targets: dict[str, int] = {}
    for node in node_of.values():
        targets[node] = targets.get(node, 0) + 1
    return {instance: node if targets[node] == 1 else instance
            for instance, node in node_of.items()}
