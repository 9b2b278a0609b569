"""The report as one self-contained HTML file: inline CSS and SVG, nothing fetched."""

from __future__ import annotations

from html import escape
from typing import Any

from slurm_gpu_exporter.report.figures.shapes import JobDetail, LowUtilReport
from slurm_gpu_exporter.report.render.svg import hbar_chart, histogram, line_chart
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

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 70em; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { padding: .25em .7em; border-bottom: 1px solid #ddd; text-align: left; }
th { white-space: nowrap; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
.charts { display: flex; flex-wrap: wrap; gap: 2em; }
.chart h3 { font-size: 1em; margin: .3em 0; }
.note { background: #fdf2e9; border-left: 4px solid #c0392b; padding: .4em .8em; margin: .3em 0; }
.muted { color: #666; }
"""



def _page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style></head>"
            f"<body>{body}</body></html>\n")


def _table(columns: tuple[str, ...], headings: dict[str, str], rows: list[dict[str, Any]],
           fmt: Any = show) -> str:
    head = "".join(f'<th class="{"n" if c in NUMERIC else ""}">{escape(headings[c])}</th>'
                   for c in columns)
    body = "".join(
        "<tr>" + "".join(f'<td class="{"n" if c in NUMERIC else ""}">'
                         f"{escape(fmt(c, row[c]))}</td>" for c in columns) + "</tr>"
        for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def low_util_html(report: LowUtilReport) -> str:
    title = low_util_title(report)
    parts = [f"<h1>{escape(title)}</h1>", f'<p class="muted">{escape(low_util_summary(report))}'
             "</p>"]
    if not report.flagged:
        parts.append(f"<p>No job under the threshold ({report.jobs_seen} GPU jobs in the "
                     "window).</p>")
        return _page(title, "".join(parts))
    waste = [(t.key, t.wasted_gpu_hours) for t in report.by_user]
    parts.append('<div class="charts">')
    parts.append('<div class="chart" id="waste-by-user"><h3>Wasted GPU-hours per user</h3>'
                 + hbar_chart(waste, "Wasted GPU-hours per user", " h") + "</div>")
    parts.append('<div class="chart" id="busy-distribution"><h3>Busy ratio of all '
                 f"{report.jobs_seen} GPU jobs</h3>"
                 + histogram(report.all_ratios, "Busy-ratio distribution",
                             mark=report.threshold) + "</div>")
    parts.append("</div>")
    parts.append("<h2>Flagged jobs</h2>")
    parts.append(_table(LOW_UTIL_COLUMNS, HEADINGS, [job_row(j) for j in report.flagged]))
    parts.extend(f'<p class="note">{escape(n)}</p>' for n in low_util_notes(report))
    for label, totals in (("User", report.by_user), ("Account", report.by_account)):
        parts.append(f"<h2>Per {label.lower()}</h2>")
        parts.append(_table(TOTAL_COLUMNS, {**HEADINGS, "key": label},
                            [total_row(t) for t in totals]))
    if report.timelines:
        parts.append(f"<h2>Busy ratio over time (the {len(report.timelines)} most wasteful "
                     "jobs)</h2>")
        for job in report.flagged:
            if job.jobid not in report.timelines:
                continue
            parts.append(f'<div class="chart timeline"><h3>Job {escape(job.shown)} '
                         f"({escape(job.user)}, {escape(job.name)})</h3>"
                         + line_chart(report.timelines[job.jobid], report.window.start,
                                      report.window.end, f"Job {job.shown} busy ratio")
                         + "</div>")
    return _page(title, "".join(parts))


def job_html(details: list[JobDetail]) -> str:
    parts = []
    for detail in details:
        parts.append(f"<h1>Job {escape(detail.usage.shown)}</h1><table>")
        for label, value in job_header(detail) + job_summary(detail):
            parts.append(f"<tr><th>{escape(label)}</th><td>{escape(value)}</td></tr>")
        parts.append("</table>")
        rows = gpu_rows(detail)
        parts.append('<div class="chart gpu-busy"><h3>Busy ratio per GPU</h3>'
                     + hbar_chart([(f"{r['node']} GPU {r['gpu']}",
                                    100 * (r["busy_ratio"] or 0.0)) for r in rows],
                                  "Busy ratio per GPU", " %") + "</div>")
        parts.append(_table(GPU_COLUMNS, GPU_HEADINGS, rows, show_gpu))
        if detail.notes:
            parts.append("<h2>Notes</h2>")
            parts.extend(f'<p class="note">{escape(n)}</p>' for n in detail.notes)
    title = "Jobs " + ", ".join(d.usage.shown for d in details)
    return _page(title, "".join(parts))
