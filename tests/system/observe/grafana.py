"""Run Grafana dashboard queries against Prometheus the way Grafana would.

Fills Grafana's variables and macros in a target's expression, resolves the
dashboards' `label_values(metric, label)` variable queries through the label API and
their `query_result(expr)` ones (with the variable's regex) through an instant query,
and renders a target's legend for a series as Grafana does.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from tests.support.daemons import Prometheus

LABEL_VALUES = re.compile(r"label_values\((?P<match>.+),\s*(?P<label>\w+)\)")
QUERY_RESULT = re.compile(r"query_result\((?P<expr>.+)\)")
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
# The dashboards' variables that offer All, at All where a caller sets none (Grafana's
# default for them): the job dashboard's nodes, the node dashboard's hidden targets.
ALL_WHEN_UNSET = {"node": ".*", "instance": ".*"}
# Series only a job's training script makes (its progress, its MLflow runs);
# tests/training_relay/test_dashboard.py checks the panels that show them, against an agent
# whose job publishes.
TRAINING = "slurm_job_training_"
MLFLOW_RUNS = "slurm_job_mlflow_run_info"


def relayed(expr: str) -> bool:
    """Whether ``expr`` reads series only a job's training script makes."""
    return TRAINING in expr or MLFLOW_RUNS in expr


@dataclass(frozen=True)
class Target:
    dashboard: str
    panel: str
    ref: str
    expr: str
    instant: bool
    legend: str = ""

    def where(self) -> str:
        return f"dashboard {self.dashboard!r}, panel {self.panel!r}, target {self.ref}"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def targets(dashboard: dict) -> list[Target]:
    found = []
    for panel in dashboard["panels"]:
        for t in panel.get("targets", []):
            found.append(Target(dashboard["title"], panel["title"], t["refId"], t["expr"],
                                bool(t.get("instant")), t.get("legendFormat", "")))
    return found


def variable_queries(dashboard: dict) -> dict[str, str]:
    return {v["name"]: v["query"]["query"] for v in dashboard["templating"]["list"]
            if v["type"] == "query"}


def variable_regexes(dashboard: dict) -> dict[str, str]:
    """The regex each query variable applies to what its query offers ('' for none)."""
    return {v["name"]: v.get("regex", "") for v in dashboard["templating"]["list"]
            if v["type"] == "query"}


def resolve_variable(prometheus: Prometheus, query: str, values: dict[str, str],
                     regex: str = "") -> list[str]:
    """The values Grafana would offer for a `label_values(...)` variable query, or for a
    `query_result(...)` one: each series as Grafana prints it (`name{l="v", ...} value
    time`), through the variable's regex (its first group where it has one)."""
    m = LABEL_VALUES.fullmatch(query)
    if m:
        return prometheus.label_values(m["label"], fill(m["match"], values, range_s=60))
    m = QUERY_RESULT.fullmatch(query)
    assert m, f"unsupported variable query {query!r}"
    lines = []
    for s in prometheus.vector(fill(m["expr"], values, range_s=60)):
        labels = dict(s["metric"])
        name = labels.pop("__name__", "")
        inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        lines.append(f"{name}{{{inner}}} {s['value'][1]} {s['value'][0]}")
    pattern = re.compile(regex.strip("/")) if regex else None
    offered = set()
    for line in lines:
        found = pattern.search(line) if pattern else None
        if pattern is None or found:
            offered.add(found.group(1) if found and found.groups() else line)
    return sorted(offered)


def multi_value(values: list[str]) -> str:
    """A multi-value variable as Grafana puts it in a Prometheus query: each value
    regex-escaped (a backslash doubled, for PromQL's string), `(a|b)` for several."""
    escaped = [re.sub(r"([\\$^*{}\[\]'+?.()|])", r"\\\\\1", v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def legend(fmt: str, labels: dict[str, str]) -> str:
    """A series' name in a panel: the target's legendFormat with its labels filled."""
    return LEGEND_LABEL.sub(lambda m: labels.get(m[1], ""), fmt)


def fill(expr: str, values: dict[str, str], range_s: int) -> str:
    """Grafana's substitutions: dashboard variables, then $__ macros."""
    macros = {"__range_s": str(range_s), "__range": f"{range_s}s",
              "__rate_interval": "4s", "__interval": "1s"}
    out = expr
    every = {**ALL_WHEN_UNSET, **values, **macros}
    for name, value in sorted(every.items(), key=lambda kv: -len(kv[0])):
        out = out.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in out, f"unfilled variable in {out!r}"
    return out


def run(prometheus: Prometheus, target: Target, values: dict[str, str], start: float,
        end: float) -> list[dict]:
    """The target's result over the dashboard's time range [start, end]."""
    range_s = max(1, int(end - start))
    expr = fill(target.expr, values, range_s)
    answer = (prometheus.query(expr, at=end) if target.instant
              else prometheus.query_range(expr, start, end, step=1))
    assert answer.get("status") == "success", (
        f"{target.where()} with {values}: {answer.get('error')}\n{expr}")
    return [s for s in answer["data"]["result"] if s.get("value") or s.get("values")]

