"""``slurm-gpu-report usage`` in every format, on sums worked out by hand: the values each
format prints, the month trend, the emissions column, the charts and inert group names."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from slurm_gpu_exporter.report.figures.usage import UsageGroup, UsageReport
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.render.usage import render_usage, usage_table

H = 3600.0
KWH = 3.6e6
JAN = 1_767_225_600.0  # 2026-01-01 00:00 UTC
MAR = 1_772_323_200.0  # 2026-03-01 00:00 UTC
SOURCE = "sqlite:///srv/[red]archive[/red].db"  # rich markup in it stays text
TITLE = ("GPU usage by user, account, jobs that ended 2026-01-01 00:00 UTC - "
         "2026-03-01 00:00 UTC")
SUMMARY = f"3 jobs, 6.0 GPU-hours held, 3.0 wasted; from the archive {SOURCE}"
HEADINGS = ["Jobs", "GPU-h held", "Busy GPU-h", "SM-active GPU-h", "Tensor GPU-h",
            "DRAM-active GPU-h", "Wasted GPU-h", "Busy", "GPU kWh", "CPU+DRAM kWh", "CPU-h"]
# alice: 4 GPU-h held, 1 busy, 2 SM-active, 0.5 tensor, 0.25 DRAM, 1 kWh GPU, 0.5 kWh CPU, 8 CPU-h
ALICE = ["2", "4.0", "1.0", "2.0", "0.5", "0.2", "3.0", "25.0%", "1.0", "0.5", "8.0"]
BOB = ["1", "2.0", "2.0", "0.0", "0.0", "0.0", "0.0", "100.0%", "0.0", "0.0", "0.0"]
JAN_ROW = ["2026-01", "1", "1.0", "0.5", "0.0", "0.0", "0.0", "0.5", "50.0%", "0.0", "0.0",
           "0.0"]
FEB_ROW = ["2026-02", "2", "5.0", "2.5", "0.0", "0.0", "0.0", "2.5", "50.0%", "0.0", "0.0",
           "0.0"]


def _report(*, months: bool = True, factor: float | None = None,
            archived: bool = False) -> UsageReport:
    alice = UsageGroup(("alice", "physics"), jobs=2, allocated_s=4 * H, busy_s=1 * H,
                       sm_active_s=2 * H, tensor_active_s=0.5 * H, dram_active_s=0.25 * H,
                       energy_j=1 * KWH, cpu_energy_j=0.5 * KWH, cpu_s=8 * H,
                       emissions_g=1234.0)
    bob = UsageGroup(("bob", "chem"), jobs=1, allocated_s=2 * H, busy_s=2 * H)
    trend = [UsageGroup((), month="2026-01", jobs=1, allocated_s=1 * H, busy_s=0.5 * H),
             UsageGroup((), month="2026-02", jobs=2, allocated_s=5 * H, busy_s=2.5 * H)]
    return UsageReport(Window(JAN, MAR), ("user", "account"), [alice, bob],
                       trend if months else [], source=SOURCE, gco2e_per_kwh=factor,
                       emissions_archived=archived)


def _empty() -> UsageReport:
    return UsageReport(Window(JAN, MAR), ("user",), [], source=SOURCE)


def _md_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row (the separator rows left out)."""
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ")]


def _terminal_rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_the_terminal_table_prints_each_group_the_months_and_the_summary() -> None:
    out = render_usage(_report(), "table")
    lines = out.splitlines()
    assert lines[0] == TITLE
    assert {len(line) for line in lines[1:-1] if line} == {140}  # the default width
    rows = _terminal_rows(out)
    assert ["alice", "physics", *ALICE] in rows and ["bob", "chem", *BOB] in rows
    assert ["By", "month"] in rows
    assert JAN_ROW in rows and FEB_ROW in rows
    assert rows.index(["alice", "physics", *ALICE]) < rows.index(["By", "month"]) < rows.index(
        JAN_ROW) < rows.index(FEB_ROW)
    assert lines[-1] == SUMMARY  # the source's brackets printed as they are, not as markup


def test_the_terminal_table_has_no_month_part_without_months() -> None:
    out = render_usage(_report(months=False), "table")
    assert "By month" not in out and "2026-01 " not in out
    assert out.splitlines()[-1] == SUMMARY


def test_the_terminal_table_in_colour_makes_the_title_bold() -> None:
    plain = render_usage(_report(), "table")
    out = render_usage(_report(), "table", color=True)
    assert out.startswith("\x1b[1m" + TITLE + "\x1b[0m")
    assert "\x1b[" not in plain and "\x1b[" not in usage_table(_report())  # plain by default


def test_an_empty_window_says_no_job_ended_in_every_text_format() -> None:
    said = "No archived job ended in the window."
    assert render_usage(_empty(), "table").splitlines() == [
        "GPU usage by user, jobs that ended 2026-01-01 00:00 UTC - 2026-03-01 00:00 UTC", said]
    md = render_usage(_empty(), "markdown")
    assert md == ("# GPU usage by user, jobs that ended 2026-01-01 00:00 UTC - "
                  f"2026-03-01 00:00 UTC\n\n{said}\n")
    page = render_usage(_empty(), "html")
    assert f"<p>{said}</p>" in page and "<table>" not in page and "<svg" not in page
    assert "<p class=\"muted\">0 jobs, 0.0 GPU-hours held, 0.0 wasted; from the archive " in page
    assert render_usage(_empty(), "csv") == "user,jobs,gpu_hours,busy_gpu_hours," \
        "sm_active_gpu_hours,tensor_active_gpu_hours,dram_active_gpu_hours," \
        "wasted_gpu_hours,busy_ratio,energy_kwh,cpu_energy_kwh,cpu_hours\n"


def test_markdown_has_the_groups_then_the_months_then_the_summary() -> None:
    md = render_usage(_report(), "markdown")
    assert md.startswith(f"# {TITLE}\n\n")
    rows = _md_rows(md)
    assert rows == [["User", "Account", *HEADINGS], ["alice", "physics", *ALICE],
                    ["bob", "chem", *BOB], ["Month", *HEADINGS], JAN_ROW, FEB_ROW]
    assert "\n## By month\n" in md
    # markdown escapes the source's brackets: the summary is text, not a link
    assert md.endswith("\n3 jobs, 6.0 GPU-hours held, 3.0 wasted; from the archive "
                       f"{SOURCE}\n")
    assert "---:" in md.splitlines()[3]  # numbers right-aligned


def test_markdown_without_months_has_no_month_table() -> None:
    md = render_usage(_report(months=False), "markdown")
    assert "By month" not in md and [r[0] for r in _md_rows(md)] == ["User", "alice", "bob"]


def test_csv_has_one_row_per_group_with_four_decimals() -> None:
    rows = list(csv.reader(io.StringIO(render_usage(_report(), "csv"))))
    assert rows == [
        ["user", "account", "jobs", "gpu_hours", "busy_gpu_hours", "sm_active_gpu_hours",
         "tensor_active_gpu_hours", "dram_active_gpu_hours", "wasted_gpu_hours", "busy_ratio",
         "energy_kwh", "cpu_energy_kwh", "cpu_hours"],
        ["alice", "physics", "2", "4.0000", "1.0000", "2.0000", "0.5000", "0.2500", "3.0000",
         "0.2500", "1.0000", "0.5000", "8.0000"],
        ["bob", "chem", "1", "2.0000", "2.0000", "0.0000", "0.0000", "0.0000", "0.0000",
         "1.0000", "0.0000", "0.0000", "0.0000"]]
    assert "\r" not in render_usage(_report(), "csv")


def test_csv_quotes_a_group_name_a_spreadsheet_would_run() -> None:
    report = _report(months=False)
    report.groups[0].key = ("=HYPERLINK(1)", "+x")
    rows = list(csv.reader(io.StringIO(render_usage(report, "csv"))))
    assert rows[1][:2] == ["'=HYPERLINK(1)", "'+x"]


def test_json_holds_every_figure_of_every_group_and_month() -> None:
    data = json.loads(render_usage(_report(), "json"))
    zeros = {"sm_active_gpu_hours": 0.0, "tensor_active_gpu_hours": 0.0,
             "dram_active_gpu_hours": 0.0, "energy_kwh": 0.0, "cpu_energy_kwh": 0.0,
             "cpu_hours": 0.0}
    assert data == {
        "window": {"start": JAN, "end": MAR}, "by": ["user", "account"], "source": SOURCE,
        "groups": [
            {"user": "alice", "account": "physics", "jobs": 2, "gpu_hours": 4.0,
             "busy_gpu_hours": 1.0, "sm_active_gpu_hours": 2.0,
             "tensor_active_gpu_hours": 0.5, "dram_active_gpu_hours": 0.25,
             "wasted_gpu_hours": 3.0, "busy_ratio": 0.25, "energy_kwh": 1.0,
             "cpu_energy_kwh": 0.5, "cpu_hours": 8.0},
            {"user": "bob", "account": "chem", "jobs": 1, "gpu_hours": 2.0,
             "busy_gpu_hours": 2.0, **zeros, "wasted_gpu_hours": 0.0, "busy_ratio": 1.0}],
        "months": [
            {"month": "2026-01", "jobs": 1, "gpu_hours": 1.0, "busy_gpu_hours": 0.5, **zeros,
             "wasted_gpu_hours": 0.5, "busy_ratio": 0.5},
            {"month": "2026-02", "jobs": 2, "gpu_hours": 5.0, "busy_gpu_hours": 2.5, **zeros,
             "wasted_gpu_hours": 2.5, "busy_ratio": 0.5}]}
    text = render_usage(_report(), "json")
    assert text.endswith("}\n") and text.startswith('{\n  "window": {\n    "start"')


def test_emissions_use_the_configured_factor_on_gpu_and_cpu_energy() -> None:
    # (1 kWh GPU + 0.5 kWh CPU) x 400 g/kWh = 600 g; bob used none
    data = json.loads(render_usage(_report(factor=400.0), "json"))
    assert [g["emissions_kg"] for g in data["groups"]] == [pytest.approx(0.6), 0.0]
    assert [m["emissions_kg"] for m in data["months"]] == [0.0, 0.0]
    rows = list(csv.reader(io.StringIO(render_usage(_report(factor=400.0), "csv"))))
    assert rows[0][-1] == "emissions_kg" and rows[1][-1] == "0.6000"
    md = _md_rows(render_usage(_report(factor=400.0), "markdown"))
    assert md[0][-1] == "kgCO2e" and md[1][-1] == "0.6" and md[3][-1] == "kgCO2e"


def test_emissions_as_archived_without_a_factor() -> None:
    data = json.loads(render_usage(_report(archived=True), "json"))
    assert [g["emissions_kg"] for g in data["groups"]] == [1.234, 0.0]
    table = render_usage(_report(archived=True), "table")
    assert "kgCO2e" in table


def test_no_emissions_column_without_a_factor_or_archived_emissions() -> None:
    data = json.loads(render_usage(_report(), "json"))
    assert "emissions_kg" not in data["groups"][0] and "emissions_kg" not in data["months"][0]
    for fmt in ("table", "markdown", "html", "csv"):
        assert "kgCO2e" not in render_usage(_report(), fmt)
        assert "emissions" not in render_usage(_report(), fmt)


def _bars(svg: str) -> list[tuple[str, str]]:
    """(title, width) of each bar of an SVG chart."""
    return re.findall(r'<rect class="bar" x="120" y="\d+" width="([0-9.]+)" height="18" '
                      r'fill="#c0392b"><title>([^<]*)</title>', svg)


def _chart(page: str, chart_id: str) -> str:
    match = re.search(f'<div class="chart" id="{chart_id}"><h3>([^<]*)</h3>(<svg .*?</svg>)'
                      "</div>", page)
    assert match, chart_id
    return match.group(1) + "\n" + match.group(2)


def test_html_has_the_charts_the_tables_and_the_month_trend() -> None:
    page = render_usage(_report(), "html")
    assert page.startswith(f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                           f"<title>{TITLE}</title>")
    assert f"<body><h1>{TITLE}</h1><p class=\"muted\">{SUMMARY}</p><div class=\"charts\">" in page
    held = _chart(page, "held-by-group")
    assert held.startswith("GPU-hours held per user, account\n")
    assert 'aria-label="GPU-hours held per group"' in held
    # 4 h is the largest: the full 270 px; 2 h half of it
    assert _bars(held) == [("270.0", "alice / physics: 4.0 h"), ("135.0", "bob / chem: 2.0 h")]
    busy = _chart(page, "busy-by-group")
    assert busy.startswith("Busy ratio per user, account\n")
    assert 'aria-label="Busy ratio per group"' in busy
    assert _bars(busy) == [("67.5", "alice / physics: 25.0 %"),
                           ("270.0", "bob / chem: 100.0 %")]
    assert '</svg></div></div><table><thead><tr><th class="">User</th>' in page
    trend = _chart(page, "trend-by-month")
    assert trend.startswith("GPU-hours held per month\n")
    assert 'aria-label="GPU-hours held per month"' in trend
    assert _bars(trend) == [("54.0", "2026-01: 1.0 h"), ("270.0", "2026-02: 5.0 h")]
    assert "</tbody></table><h2>By month</h2><div class=\"chart\" id=\"trend-by-month\">" in page
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", page)
    assert cells == ["alice", "physics", *ALICE, "bob", "chem", *BOB, *JAN_ROW, *FEB_ROW]
    assert page.endswith("</tbody></table></body></html>\n")
    assert '<th class="">Month</th><th class="n">Jobs</th>' in page


def test_html_without_months_has_no_trend() -> None:
    page = render_usage(_report(months=False), "html")
    assert "By month" not in page and "trend-by-month" not in page
    assert page.endswith("</tbody></table></body></html>\n")


def test_html_charts_show_the_first_thirty_groups_and_the_table_all() -> None:
    groups = [UsageGroup((f"u{i:02d}",), jobs=1, allocated_s=(40 - i) * H) for i in range(31)]
    report = UsageReport(Window(JAN, MAR), ("user",), groups)
    page = render_usage(report, "html")
    assert [t for _, t in _bars(_chart(page, "held-by-group"))] == [
        f"u{i:02d}: {40 - i:.1f} h" for i in range(30)]
    # nothing busy: every busy bar is empty, 0 %
    assert {b for b in _bars(_chart(page, "busy-by-group"))} == {
        ("0.0", f"u{i:02d}: 0.0 %") for i in range(30)}
    assert "<td class=\"\">u30</td>" in page


def test_html_escapes_group_names_and_the_grouping() -> None:
    report = _report(months=False)
    report.groups[0].key = ('<img src=x onerror="alert(1)">', "a&b")
    page = render_usage(report, "html")
    assert "<img" not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt; / a&amp;b" in page
    assert '<td class="">&lt;img src=x onerror=&quot;alert(1)&quot;&gt;</td>' in page


def test_the_terminal_table_prints_markup_in_group_names_as_text() -> None:
    report = _report(months=False)
    report.groups[0].key = ("[i]e[/i]", "x\x1b[2Jy")
    out = render_usage(report, "table", color=True)
    assert "[i]e[/i]" in out and "\x1b[2J" not in out and "x\ufffd[2Jy" in out


def test_each_format_is_its_own_renderer() -> None:
    report = _report()
    assert render_usage(report, "json").startswith("{")
    assert render_usage(report, "csv").startswith("user,account,jobs,")
    assert render_usage(report, "markdown").startswith("# GPU usage")
    assert render_usage(report, "html").startswith("<!DOCTYPE html>")
    assert render_usage(report, "table").startswith("GPU usage")
    with pytest.raises(KeyError):
        render_usage(report, "yaml")
