"""Run Grafana dashboard queries against Prometheus the way Grafana would.

Fills Grafana's variables and macros in a target's expression, and resolves the
dashboards' `label_values(metric, label)` variable queries through the label API.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from tests.support.daemons import Prometheus

LABEL_VALUES = re.compile(r"label_values\((?P<match>.+),\s*(?P<label>\w+)\)")
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

    def where(self) -> str:
        return f"dashboard {self.dashboard!r}, panel {self.panel!r}, target {self.ref}"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def targets(dashboard: dict) -> list[Target]:
    found = []
    for panel in dashboard["panels"]:
        for t in panel.get("targets", []):
            found.append(Target(dashboard["title"], panel["title"], t["refId"], t["expr"],
                                bool(t.get("instant"))))
    return found


def variable_queries(dashboard: dict) -> dict[str, str]:
    return {v["name"]: v["query"]["query"] for v in dashboard["templating"]["list"]
            if v["type"] == "query"}


def resolve_variable(prometheus: Prometheus, query: str, values: dict[str, str]) -> list[str]:
    """The values Grafana would offer for a `label_values(...)` variable query."""
    m = LABEL_VALUES.fullmatch(query)
    assert m, f"unsupported variable query {query!r}"
    return prometheus.label_values(m["label"], fill(m["match"], values, range_s=60))


def fill(expr: str, values: dict[str, str], range_s: int) -> str:
    """Grafana's substitutions: dashboard variables, then $__ macros."""
    macros = {"__range_s": str(range_s), "__range": f"{range_s}s",
              "__rate_interval": "4s", "__interval": "1s"}
    out = expr
    for name, value in sorted({**values, **macros}.items(), key=lambda kv: -len(kv[0])):
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

