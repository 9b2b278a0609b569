"""The SVG charts at their edges (no values, no samples), the text helpers that make
user text inert, and the low-util page of a window without a flagged job."""

from __future__ import annotations

import re

from slurm_gpu_exporter.report.figures.shapes import LowUtilReport
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.inert_text import plain, slurm_value
from slurm_gpu_exporter.report.render.html import low_util_html
from slurm_gpu_exporter.report.render.inert import csv_cell, markdown, terminal
from slurm_gpu_exporter.report.render.svg import hbar_chart, histogram, line_chart

START = 1_795_420_800.0  # 2026-11-23 08:00 UTC
END = START + 7 * 86400


def test_an_empty_histogram_has_empty_bars_on_a_scale_of_one() -> None:
    svg = histogram([], "busy", bins=10)
    heights = re.findall(r'class="bar"[^>]*height="([0-9.]+)"', svg)
    assert heights == ["0.0"] * 10
    # the scale's top, printed at the top left of the plot
    assert svg.endswith('<text x="4.0" y="20.0" font-size="10" text-anchor="start">1</text>'
                        "</svg>")


def test_a_histogram_counts_each_ratio_in_its_tenth() -> None:
    svg = histogram([0.0, 0.05, 0.15, 0.15, 0.99], "busy", bins=10)
    titles = re.findall(r"<title>([^<]*)</title>", svg)
    assert titles[:3] == ["0-10 %: 2 jobs", "10-20 %: 2 jobs", "20-30 %: 0 jobs"]
    assert titles[-1] == "90-100 %: 1 jobs"
    assert svg.endswith('font-size="10" text-anchor="start">2</text></svg>')


def test_a_line_chart_without_points_says_so() -> None:
    svg = line_chart([], START, END, "busy")
    assert "<polyline" not in svg
    assert ('<text x="48.0" y="45.0" font-size="11" text-anchor="start">'
            "no samples in the window</text>") in svg


def test_a_line_chart_places_points_by_time_and_ratio() -> None:
    svg = line_chart([(START, 0.0), (END, 1.0)], START, END, "busy")
    # 890 px wide from x=40, 74 px high from y=8: (40, 82) to (930, 8)
    assert 'points="40.0,82.0 930.0,8.0"' in svg
    assert "no samples" not in svg


def test_bars_of_zero_are_empty_and_the_largest_fills_the_width() -> None:
    svg = hbar_chart([("a", 0.0), ("b", 0.0)], "x")
    assert re.findall(r'width="([0-9.]+)" height="18"', svg) == ["0.0", "0.0"]
    svg = hbar_chart([("a", 3.0), ("b", 1.0)], "x", " h")
    assert re.findall(r'width="([0-9.]+)" height="18"', svg) == ["270.0", "90.0"]
    assert hbar_chart([], "x").startswith('<svg xmlns="http://www.w3.org/2000/svg" width="460" '
                                          'height="30"')


def test_markdown_escapes_html_entities_and_markup() -> None:
    assert markdown("a&b <i>x</i>") == "a&amp;b &lt;i&gt;x&lt;/i&gt;"
    assert markdown("&amp;") == "&amp;amp;"
    assert markdown("*a* _b_ [c](d) `e` |f| ~g~ \\") == (
        "\\*a\\* \\_b\\_ \\[c\\](d) \\`e\\` \\|f\\| \\~g\\~ \\\\")
    assert markdown("line\nbreak") == "line\ufffdbreak"


def test_terminal_text_escapes_markup_and_control_characters() -> None:
    assert terminal("[bold]x[/bold]\x1b[2J") == "\\[bold]x\\[/bold]\ufffd[2J"
    assert terminal(42) == "42"


def test_csv_cells_starting_a_formula_get_a_quote() -> None:
    for cell in ("=1+1", "+1", "-1", "@SUM(A1)"):
        assert csv_cell(cell) == "'" + cell
    assert csv_cell("a=1") == "a=1" and csv_cell("") == ""
    assert csv_cell("\t=1") == "\ufffd=1"


def test_plain_replaces_controls_and_cuts_to_the_limit() -> None:
    assert plain("a\r\nb\x00\x7f\x85\u2028\u202e\u2066c") == "a\ufffd\ufffdb" + "\ufffd" * 6 + "c"
    assert plain("abcdef", limit=3) == "abc" and plain("abc", limit=0) == ""
    assert plain(12) == "12" and plain("é ü 漢") == "é ü 漢"


def test_slurm_value_keeps_only_the_characters_slurm_keeps() -> None:
    assert slurm_value("idle GPUs: 2/4 (50%) job=1,2;x@y+z-w_v.") == (
        "idle GPUs: 2/4 (50%) job=1,2;x@y+z-w_v.")
    assert slurm_value("a'b\"c\nd$e`f") == "a_b_c_d_e_f"
    assert slurm_value("x" * 300) == "x" * 200
    assert slurm_value("abcdef", limit=4) == "abcd"
    assert slurm_value(7) == "7"


def test_the_low_util_page_of_a_window_without_flagged_jobs() -> None:
    report = LowUtilReport(window=Window(START, END), threshold=0.25, jobs_seen=3, flagged=[],
                           queries=9)
    page = low_util_html(report)
    title = "Jobs under 25% GPU busy, 2026-11-23 08:00 UTC - 2026-11-30 08:00 UTC"
    assert f"<title>{title}</title>" in page
    assert page.endswith(
        f"<body><h1>{title}</h1><p class=\"muted\">0 of 3 GPU jobs flagged, 0.0 GPU-hours "
        "wasted; 9 PromQL queries</p><p>No job under the threshold (3 GPU jobs in the "
        "window).</p></body></html>\n")
