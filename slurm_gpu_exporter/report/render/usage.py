"""``usage`` in every format. Group names (users, accounts, partitions) are user text:
they go through the same table, CSV and HTML helpers as every other report."""

from __future__ import annotations

import csv
import io
import json
from html import escape
from typing import Any

from slurm_gpu_exporter.report.figures.table import FIGURES as JOB_FIGURES
from slurm_gpu_exporter.report.figures.usage import UsageGroup, UsageReport
from slurm_gpu_exporter.report.render import html, text
from slurm_gpu_exporter.report.render.svg import hbar_chart
from slurm_gpu_exporter.report.render.values import HEADINGS, when

# The summed job figures shown as GPU-hours (figures/table.py ``usage_heading``).
GPU_HOURS = {f"{f.name}_gpu_hours": f for f in JOB_FIGURES if f.usage_heading}
FIGURES = ("jobs", "gpu_hours", "busy_gpu_hours", *GPU_HOURS, "wasted_gpu_hours",
           "busy_ratio", "energy_kwh", "cpu_energy_kwh", "cpu_hours")
USAGE_HEADINGS = {
    **HEADINGS, "account": "Account", "user": "User", "partition": "Partition",
    "cluster": "Cluster", "month": "Month", "gpu_hours": "GPU-h held",
    "busy_gpu_hours": "Busy GPU-h", "wasted_gpu_hours": "Wasted GPU-h", "busy_ratio": "Busy",
    "energy_kwh": "GPU kWh", "cpu_hours": "CPU-h", "emissions_kg": "kgCO2e",
    "cpu_energy_kwh": "CPU+DRAM kWh",
    **{name: f.usage_heading for name, f in GPU_HOURS.items()},
}
CHART_GROUPS = 30


def usage_row(report: UsageReport, group: UsageGroup) -> dict[str, Any]:
    """One group (or month) as plain values."""
    row: dict[str, Any] = dict(zip(report.by, group.key, strict=False))
    if group.month:
        row["month"] = group.month
    row.update({"jobs": group.jobs, "gpu_hours": group.gpu_hours,
                "busy_gpu_hours": group.busy_gpu_hours,
                **{name: group.gpu_hours_of(f.job_column) for name, f in GPU_HOURS.items()},
                "wasted_gpu_hours": group.wasted_gpu_hours, "busy_ratio": group.busy_ratio,
                "energy_kwh": group.energy_kwh, "cpu_energy_kwh": group.cpu_energy_kwh,
                "cpu_hours": group.cpu_hours})
    if _shows_emissions(report):
        row["emissions_kg"] = _emissions_kg(report, group)
    return row


def _shows_emissions(report: UsageReport) -> bool:
    return bool(report.gco2e_per_kwh) or report.emissions_archived


def _emissions_kg(report: UsageReport, group: UsageGroup) -> float:
    """With --config's factor: the archived GPU and CPU energy times it; without: the
    emissions as archived (at the factor of the time each job was archived)."""
    if report.gco2e_per_kwh:
        return (group.energy_kwh + group.cpu_energy_kwh) * report.gco2e_per_kwh / 1000
    return group.emissions_g / 1000


def usage_title(report: UsageReport) -> str:
    return (f"GPU usage by {', '.join(report.by)}, jobs that ended {when(report.window.start)}"
            f" - {when(report.window.end)}")


def usage_summary(report: UsageReport) -> str:
    jobs = sum(g.jobs for g in report.groups)
    held = sum(g.gpu_hours for g in report.groups)
    wasted = sum(g.wasted_gpu_hours for g in report.groups)
    return (f"{jobs} jobs, {held:.1f} GPU-hours held, {wasted:.1f} wasted; from the archive "
            f"{report.source}")


def _figures(report: UsageReport) -> tuple[str, ...]:
    return (*FIGURES, "emissions_kg") if _shows_emissions(report) else FIGURES


def _columns(report: UsageReport) -> tuple[str, ...]:
    return (*report.by, *_figures(report))


def _month_columns(report: UsageReport) -> tuple[str, ...]:
    return ("month", *_figures(report))


def usage_table(report: UsageReport, width: int = 140, color: bool = False) -> str:
    console, out = text._console(width, color)
    console.print(usage_title(report), style="bold", markup=False)
    if not report.groups:
        console.print("No archived job ended in the window.", markup=False)
        return out.getvalue()
    console.print(text._table(None, _columns(report), USAGE_HEADINGS,
                              [usage_row(report, g) for g in report.groups]))
    if report.months:
        console.print(text._table("By month", _month_columns(report), USAGE_HEADINGS,
                                  [usage_row(report, m) for m in report.months]))
    console.print(usage_summary(report), markup=False)
    return out.getvalue()


def usage_csv(report: UsageReport) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    columns = _columns(report)
    writer.writerow(columns)
    for group in report.groups:
        row = usage_row(report, group)
        writer.writerow(text._csv_value(row[c]) for c in columns)
    return out.getvalue()


def usage_json(report: UsageReport) -> str:
    data = {"window": {"start": report.window.start, "end": report.window.end},
            "by": list(report.by), "source": report.source,
            "groups": [usage_row(report, g) for g in report.groups],
            "months": [usage_row(report, m) for m in report.months]}
    return json.dumps(data, indent=2) + "\n"


def usage_markdown(report: UsageReport) -> str:
    parts = [f"# {usage_title(report)}\n"]
    if not report.groups:
        parts.append("No archived job ended in the window.\n")
        return "\n".join(parts)
    parts.append(text._md_table(_columns(report), USAGE_HEADINGS,
                                [usage_row(report, g) for g in report.groups]))
    if report.months:
        parts.append("## By month\n")
        parts.append(text._md_table(_month_columns(report), USAGE_HEADINGS,
                                    [usage_row(report, m) for m in report.months]))
    parts.append(usage_summary(report) + "\n")
    return "\n".join(parts)


def usage_html(report: UsageReport) -> str:
    title = usage_title(report)
    parts = [f"<h1>{escape(title)}</h1>",
             f'<p class="muted">{escape(usage_summary(report))}</p>']
    if not report.groups:
        parts.append("<p>No archived job ended in the window.</p>")
        return html._page(title, "".join(parts))
    shown = report.groups[:CHART_GROUPS]
    held = [(" / ".join(g.key), g.gpu_hours) for g in shown]
    busy = [(" / ".join(g.key), 100 * (g.busy_ratio or 0.0)) for g in shown]
    parts.append('<div class="charts">')
    parts.append('<div class="chart" id="held-by-group"><h3>GPU-hours held per '
                 f"{escape(', '.join(report.by))}</h3>"
                 + hbar_chart(held, "GPU-hours held per group", " h") + "</div>")
    parts.append('<div class="chart" id="busy-by-group"><h3>Busy ratio per '
                 f"{escape(', '.join(report.by))}</h3>"
                 + hbar_chart(busy, "Busy ratio per group", " %") + "</div>")
    parts.append("</div>")
    parts.append(html._table(_columns(report), USAGE_HEADINGS,
                             [usage_row(report, g) for g in report.groups]))
    if report.months:
        trend = [(m.month, m.gpu_hours) for m in report.months]
        parts.append("<h2>By month</h2>")
        parts.append('<div class="chart" id="trend-by-month"><h3>GPU-hours held per month'
                     "</h3>" + hbar_chart(trend, "GPU-hours held per month", " h") + "</div>")
        parts.append(html._table(_month_columns(report), USAGE_HEADINGS,
                                 [usage_row(report, m) for m in report.months]))
    return html._page(title, "".join(parts))


def render_usage(report: UsageReport, fmt: str, color: bool = False) -> str:
    """``usage`` in one of the report's formats."""
    if fmt == "table":
        return usage_table(report, color=color)
    return {"csv": usage_csv, "json": usage_json, "markdown": usage_markdown,
            "html": usage_html}[fmt](report)

