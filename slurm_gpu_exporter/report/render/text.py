"""The report as a terminal table (rich), CSV, JSON and Markdown."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from slurm_gpu_exporter.report.figures.job_events import fault_lines, throttle_lines
from slurm_gpu_exporter.report.figures.shapes import JobDetail, LowUtilReport
from slurm_gpu_exporter.report.figures.table import gpm_activities, job_shown
from slurm_gpu_exporter.report.render.inert import csv_cell, markdown, terminal
from slurm_gpu_exporter.report.render.values import (
    GPU_COLUMNS,
    GPU_HEADINGS,
    HEADINGS,
    LOW_UTIL_COLUMNS,
    NUMERIC,
    TOTAL_COLUMNS,
    gpu_rows,
    job_header,
    job_row,
    job_summary,
    low_util_notes,
    low_util_summary,
    low_util_title,
    show,
    show_gpu,
    total_row,
)


def _console(width: int, color: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=width, color_system="standard" if color else None,
                   force_terminal=color, highlight=False, emoji=False), out


def _table(title: str | None, columns: tuple[str, ...], headings: dict[str, str],
           rows: list[dict[str, Any]], fmt: Any = show) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for col in columns:
        table.add_column(headings[col], justify="right" if col in NUMERIC else "left")
    for row in rows:
        table.add_row(*(terminal(fmt(col, row[col])) for col in columns))
    return table


# --- low-util ----------------------------------------------------------------------


def low_util_table(report: LowUtilReport, width: int = 120, color: bool = False) -> str:
    console, out = _console(width, color)
    console.print(low_util_title(report), style="bold")
    if not report.flagged:
        console.print(f"No job under the threshold ({report.jobs_seen} GPU jobs in the "
                      "window).")
        return out.getvalue()
    console.print(_table(None, LOW_UTIL_COLUMNS, HEADINGS,
                         [job_row(j) for j in report.flagged]))
    for note in low_util_notes(report):
        console.print(terminal(note))
    for title, totals in (("Per user", report.by_user), ("Per account", report.by_account)):
        headings = {**HEADINGS, "key": title.split()[1].capitalize()}
        console.print(_table(title, TOTAL_COLUMNS, headings, [total_row(t) for t in totals]))
    console.print(low_util_summary(report))
    return out.getvalue()


def low_util_csv(report: LowUtilReport) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow((*LOW_UTIL_COLUMNS, "note"))
    for job in report.flagged:
        row = job_row(job)
        writer.writerow([*(_csv_value(row[c]) for c in LOW_UTIL_COLUMNS),
                         _csv_value(report.notes.get(job.jobid))])
    return out.getvalue()


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4f}"
    return csv_cell(value) if isinstance(value, str) else str(value)


def low_util_json(report: LowUtilReport) -> str:
    data = {
        "window": {"start": report.window.start, "end": report.window.end},
        "threshold": report.threshold, "jobs_seen": report.jobs_seen,
        "queries": report.queries,
        "flagged": [{**job_row(j), "name": j.name, "cluster": j.cluster,
                     "slowed_ratio": j.slowed_ratio, "slowed_reason": j.slowed_reason or None,
                     "note": report.notes.get(j.jobid)}
                    for j in report.flagged],
        "users": [total_row(t) for t in report.by_user],
        "accounts": [total_row(t) for t in report.by_account],
    }
    return json.dumps(data, indent=2) + "\n"


def _md_table(columns: tuple[str, ...], headings: dict[str, str], rows: list[dict[str, Any]],
              fmt: Any = show) -> str:
    lines = ["| " + " | ".join(headings[c] for c in columns) + " |",
             "|" + "|".join("---:" if c in NUMERIC else "---" for c in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(markdown(fmt(c, row[c])) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def low_util_markdown(report: LowUtilReport) -> str:
    parts = [f"# {low_util_title(report)}\n"]
    if not report.flagged:
        parts.append(f"No job under the threshold ({report.jobs_seen} GPU jobs in the "
                     "window).\n")
        return "\n".join(parts)
    parts.append(_md_table(LOW_UTIL_COLUMNS, HEADINGS, [job_row(j) for j in report.flagged]))
    if report.notes:
        parts.append("\n".join(f"- {markdown(n)}" for n in low_util_notes(report)) + "\n")
    for title, totals in (("Per user", report.by_user), ("Per account", report.by_account)):
        parts.append(f"## {title}\n")
        headings = {**HEADINGS, "key": title.split()[1].capitalize()}
        parts.append(_md_table(TOTAL_COLUMNS, headings, [total_row(t) for t in totals]))
    parts.append(low_util_summary(report) + "\n")
    return "\n".join(parts)


# --- job ----------------------------------------------------------------------------


def job_table(details: list[JobDetail], width: int = 100, color: bool = False) -> str:
    console, out = _console(width, color)
    for i, detail in enumerate(details):
        if i:
            console.rule()
        header = Table.grid(padding=(0, 2))
        header.add_column(style="bold")
        header.add_column()
        for label, value in job_header(detail) + job_summary(detail):
            header.add_row(label, terminal(value))
        console.print(header)
        console.print(_table(None, GPU_COLUMNS, GPU_HEADINGS, gpu_rows(detail), show_gpu))
        if detail.notes:
            console.print("Notes", style="bold")
            notes = Table.grid(padding=(0, 1))
            notes.add_column()
            notes.add_column()  # wraps under its own start, not under the bullet
            for note in detail.notes:
                notes.add_row("  *", terminal(note))
            console.print(notes)
    return out.getvalue()


def job_csv(details: list[JobDetail]) -> str:
    """One row per GPU, the job's columns repeated."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    job_cols = ("job", "user", "account", "partition", "state", "start", "run_time_s",
                "cpu_efficiency", "memory_peak_gib", "memory_request_gib")
    gpu_cols = (*GPU_COLUMNS, "uuid", "slowed_ratio")
    writer.writerow(job_cols + gpu_cols + ("xid_errors",))
    for detail in details:
        facts = _job_values(detail)
        for gpu in gpu_rows(detail):
            xids = sum(e["count"] for e in gpu["errors"] if e["kind"] == "xid")
            writer.writerow([_csv_value(facts[c]) for c in job_cols]
                            + [_csv_value(gpu[c]) for c in gpu_cols] + [f"{xids:.0f}"])
    return out.getvalue()


def _job_values(detail: JobDetail) -> dict[str, Any]:
    usage = detail.usage
    gib = 2**30
    return {
        "job": usage.shown, "user": usage.user, "account": usage.account,
        "partition": usage.partition, "name": usage.name,
        "state": detail.accounting.state if detail.accounting and detail.accounting.state
        else ("RUNNING" if detail.running else "ENDED"),
        "running": detail.running, "start": detail.start, "end": detail.end,
        "run_time_s": detail.elapsed_s,
        "time_limit_s": detail.accounting.time_limit_s if detail.accounting else None,
        "cpus": detail.cpus, "cpu_efficiency": detail.cpu_efficiency,
        "memory_request_gib": detail.memory_request / gib if detail.memory_request else None,
        "gpus": usage.gpus, "gpu_hours": usage.gpu_hours, "busy_ratio": usage.busy_ratio,
        "sm_active_ratio": usage.sm_active_ratio, "idle_gpus": usage.idle_gpus,
        **{f.ratio: usage.activity_ratio(f.job_attr) for f in gpm_activities()},
        "emissions_gco2e": detail.emissions_gco2e,
        "unmeasured_gpu_hours": usage.unknown_s / 3600,
        # mean power per GPU held: the energy over the GPU-seconds held, measured or not
        "gpu_power_mean_w": detail.energy_j / (usage.allocated_s + usage.unknown_s)
        if detail.energy_j is not None and usage.allocated_s + usage.unknown_s > 0 else None,
        # what slowed the GPUs and what went wrong on them, as the report's lines say it
        "gpu_throttled": [f"GPU {name}: {text}" for name, text in throttle_lines(detail)],
        "gpu_errors": fault_lines(detail),
        **job_shown(detail),  # the table's figures that the job has a value of
    }


def job_json(details: list[JobDetail], queries: int) -> str:
    data = {"queries": queries,
            "jobs": [{**_job_values(d), "gpus_detail": gpu_rows(d), "notes": d.notes}
                     for d in details]}
    return json.dumps(data, indent=2) + "\n"


def job_markdown(details: list[JobDetail]) -> str:
    parts = []
    for detail in details:
        parts.append(f"# Job {markdown(detail.usage.shown)}\n")
        parts.append("\n".join(f"- **{label}**: {markdown(value)}" for label, value in
                               job_header(detail) + job_summary(detail)) + "\n")
        parts.append(_md_table(GPU_COLUMNS, GPU_HEADINGS, gpu_rows(detail), show_gpu))
        if detail.notes:
            parts.append("## Notes\n")
            parts.append("\n".join(f"- {markdown(n)}" for n in detail.notes) + "\n")
    return "\n".join(parts)
