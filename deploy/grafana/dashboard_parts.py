"""The building blocks of the dashboards generate_dashboards.py writes: targets, panels,
variables, layout, and the one join that names a series' Slurm node."""

from __future__ import annotations

from typing import Any

DS = {"type": "prometheus", "uid": "${datasource}"}
C = 'cluster=~"$cluster"'
JOB = f'{C}, jobid="$jobid"'
USER = f'{C}, user="$user"'
# The node dashboard selects by target: the hidden `instance` variable holds the targets
# of the Slurm nodes picked in `node` (a selector on the target, not a join over every
# node of the cluster).
NODE = f'{C}, instance=~"$instance"'
# The job dashboard's node variable: some of the job's Slurm nodes (All: every one).
JOB_NODES = 'slurm_node=~"$node"'
# The Slurm node of each agent's target (deploy/prometheus/rules, group
# slurm-gpu-exporter.nodes): slurm_node is the name the agent publishes, or the target
# where it names none. Dashboards show and pick nodes by it, never by `instance`.
NODE_MAP = "instance:slurm_gpu_exporter_node_info:last1h"
JOB_LINK = ("/d/slurm-gpu-job/slurm-gpu-job?var-cluster=${__data.fields.cluster}"
            "&var-jobid=${__data.fields.jobid}")

Panel = dict[str, Any]


def target(expr: str, legend: str = "", instant: bool = False, ref: str = "A") -> dict:
    t: dict[str, Any] = {"datasource": DS, "expr": expr, "refId": ref,
                         "legendFormat": legend or "__auto"}
    if instant:
        t.update(instant=True, range=False, format="table")
    return t


def panel(kind: str, title: str, targets: list[dict], w: int, h: int,
          unit: str = "", description: str = "", **extra: Any) -> Panel:
    for i, t in enumerate(targets):
        t["refId"] = chr(ord("A") + i)
        if kind != "table":
            t.pop("format", None)  # stats and gauges take series, named by legendFormat
    p: Panel = {"type": kind, "title": title, "datasource": DS, "targets": targets,
                "gridPos": {"w": w, "h": h},
                "fieldConfig": {"defaults": {"unit": unit} if unit else {}, "overrides": []},
                "options": {}}
    if description:
        p["description"] = description
    p.update(extra)
    return p


def named(expr: str, nodes: str = "") -> str:
    """``expr``'s series, each keeping ``cluster`` and ``instance``, with the Slurm node
    of their target joined in as ``slurm_node``; only those of the picked nodes where
    ``nodes`` (a matcher on slurm_node) is given. A target the recorded map lacks (the
    rules not loaded, a time range before they were) keeps its series, named by the
    target itself: no series is lost for want of a node name."""
    picked = f"{NODE_MAP}{{{C}{', ' + nodes if nodes else ''}}}"
    return (f"({expr}) * on (cluster, instance) group_left (slurm_node) {picked}"
            f" or ignoring (slurm_node) label_join(({expr}) unless on (cluster, instance) "
            f'{NODE_MAP}{{{C}}}, "slurm_node", "", "instance")')


def ratio_thresholds() -> dict:
    """Red for a held GPU doing nothing, amber for low use, green above."""
    return {"mode": "absolute", "steps": [{"color": "red", "value": None},
                                          {"color": "orange", "value": 0.05},
                                          {"color": "green", "value": 0.5}]}


def with_ratio_colours(p: Panel) -> Panel:
    p["fieldConfig"]["defaults"].update(min=0, max=1, thresholds=ratio_thresholds(),
                                        color={"mode": "thresholds"})
    return p


def var_query(name: str, label: str, query: str, include_all: bool = False,
              **extra: Any) -> dict:
    v = {"name": name, "label": label, "type": "query", "datasource": DS,
         "query": {"query": query, "refId": f"{name}-var"}, "definition": query,
         "refresh": 2, "sort": 3 if name == "jobid" else 1, "current": {}}
    if include_all:
        v.update(includeAll=True, allValue=".*", multi=False)
    v.update(extra)
    return v


def job_nodes_var() -> dict:
    """The Slurm nodes the job ran on, from the recorded node map (All: every one)."""
    query = (f"query_result({NODE_MAP}{{{C}}} and on (cluster, instance) "
             f"last_over_time(slurm_job_info{{{JOB}}}[$__range]))")
    return var_query("node", "Node", query, include_all=True, multi=True,
                     regex='/slurm_node="([^"]+)"/',
                     current={"text": "All", "value": "$__all"},
                     description="Narrows the per-GPU and per-node panels to some of the "
                                 "job's Slurm nodes; the job's totals stay whole.")


def node_vars() -> list[dict]:
    """The Slurm nodes to show (by name), and, hidden, their scrape targets, which the
    panels select by."""
    return [var_query("node", "Node", f"label_values({NODE_MAP}{{{C}}}, slurm_node)",
                      multi=True),
            var_query("instance", "Targets",
                      f'label_values({NODE_MAP}{{{C}, slurm_node=~"$node"}}, instance)',
                      includeAll=True, multi=True, hide=2,
                      current={"text": "All", "value": "$__all"})]


def datasource_var() -> dict:
    # Import fills ${DS_PROMETHEUS} in (the __inputs entry); provisioned as is, Grafana
    # falls back to the default Prometheus data source.
    return {"name": "datasource", "label": "Prometheus", "type": "datasource",
            "query": "prometheus", "hide": 0,
            "current": {"text": "${DS_PROMETHEUS}", "value": "${DS_PROMETHEUS}"}}


def cluster_var() -> dict:
    return var_query("cluster", "Cluster", "label_values(slurm_job_info, cluster)",
                     include_all=True)


def layout(panels: list[Panel]) -> list[Panel]:
    """Place panels left to right in rows of 24 units; ids in order."""
    x = y = row_h = 0
    for i, p in enumerate(panels, 1):
        g = p["gridPos"]
        if x + g["w"] > 24:
            x, y, row_h = 0, y + row_h, 0
        g.update(x=x, y=y)
        x += g["w"]
        row_h = max(row_h, g["h"])
        p["id"] = i
    return panels


def dashboard(uid: str, title: str, description: str, variables: list[dict],
              panels: list[Panel], time_from: str = "now-6h",
              annotations: list[dict] | None = None) -> dict:
    board = {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource",
                      "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "__requires": [{"type": "datasource", "id": "prometheus", "name": "Prometheus",
                        "version": "1.0.0"}],
        "uid": uid, "title": title, "description": description,
        "tags": ["slurm", "gpu", "slurm-gpu-exporter"], "editable": True,
        "schemaVersion": 39, "version": 1, "refresh": "1m",
        "time": {"from": time_from, "to": "now"}, "timezone": "",
        "templating": {"list": [datasource_var(), *variables]},
        "links": [{"title": "Slurm GPU dashboards", "type": "dashboards", "asDropdown": True,
                   "tags": ["slurm-gpu-exporter"], "includeVars": False,
                   "keepTime": True}],
        "panels": layout(panels),
    }
    if annotations:
        board["annotations"] = {"list": annotations}
    return board
