"""``enforce``'s decisions as a terminal table or JSON.

Job names and users are the users' own text: control characters are shown escaped
and rich markup is never interpreted, so a name cannot move the cursor, recolour the
terminal or hide a row.
"""

from __future__ import annotations

import io
import json
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from slurm_gpu_exporter.report.enforce.decisions import Decision
from slurm_gpu_exporter.report.enforce.policy import span
from slurm_gpu_exporter.report.render.values import when

COLUMNS = ("Job", "User", "Name", "GPUs", "Nodes", "Idle for", "Action", "Reason")


def printable(text: str) -> str:
    """``text`` with every non-printable character written as an escape (``\\x1b``)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode()
                   for c in text)


def _action(decision: Decision) -> str:
    if decision.action == "warn":
        return f"warn {decision.warning}"
    return decision.action


def decisions_table(decisions: list[Decision], dry_run: bool, width: int = 140) -> str:
    """One row per job; the title says whether anything was done."""
    title = ("Dry run: what enforce --cancel would do" if dry_run
             else "What enforce did")
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for column in COLUMNS:
        table.add_column(column, justify="right" if column == "GPUs" else "left")
    for d in decisions:
        idle = span(d.idle_for_s) if d.idle_for_s else "-"
        cells = (d.shown, d.user, d.name, str(d.gpus), ",".join(d.nodes), idle, _action(d),
                 d.reason)
        table.add_row(*(Text(printable(c)) for c in cells))
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, highlight=False, emoji=False,
            markup=False).print(table)
    if not decisions:
        out.write("No running job holds GPUs in the metrics.\n")
    return out.getvalue()


def decision_record(decision: Decision) -> dict[str, Any]:
    """A decision as plain JSON values."""
    return {
        "jobid": decision.jobid, "job": decision.shown, "target": decision.target,
        "user": decision.user, "account": decision.account,
        "partition": decision.partition, "name": decision.name, "gpus": decision.gpus,
        "nodes": list(decision.nodes), "idle_for_seconds": decision.idle_for_s,
        "action": decision.action, "warning": decision.warning,
        "cancel_at": when(decision.cancel_at) if decision.cancel_at else None,
        "doubtful": decision.doubtful, "reason": decision.reason,
    }


def decisions_json(decisions: list[Decision], dry_run: bool, queries: int) -> str:
    return json.dumps({"dry_run": dry_run, "queries": queries,
                       "decisions": [decision_record(d) for d in decisions]}, indent=1) + "\n"
