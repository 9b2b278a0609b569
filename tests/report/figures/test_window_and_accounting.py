"""Pure parsing: report windows, PromQL selectors, sacct fields."""

from __future__ import annotations

import pytest

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.window import Window, make_window, parse_duration
from slurm_gpu_exporter.report.prometheus.queries import (
    Filters,
    jobid_regex,
    low_util_queries,
    selector,
)
from slurm_gpu_exporter.report.slurm.accounting import parse_reqmem, parse_sacct, parse_timelimit

NOW = 1_796_025_600.0


@pytest.mark.parametrize(("text", "seconds"), [
    ("7d", 7 * 86400), ("36h", 36 * 3600), ("1h30m", 5400), ("90", 90), ("2w", 14 * 86400)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_window_from_since_and_from_iso_dates() -> None:
    assert make_window("7d", None, None, NOW) == Window(NOW - 7 * 86400, NOW)
    window = make_window(None, "2026-11-29T08:00", "2026-11-30T08:00:00+00:00", NOW)
    assert window == Window(NOW - 86400, NOW) and window.range == "86400s"


@pytest.mark.parametrize(("start", "end", "promql"), [
    (100.0, 106.4, "6400ms"), (100.0, 106.0, "6s"), (0.0, 0.0004, "1ms"),
    (1_800_000_000.7, 1_800_000_007.2, "6500ms")])
def test_a_windows_range_is_exact_to_the_millisecond(start: float, end: float,
                                                     promql: str) -> None:
    """The baselines are read ``offset`` the range before the end: rounded to the second,
    a 6.4 s window's baseline fell 0.4 s after its start, and a sample scraped in
    between was lost from the figures (a quarter of a short window's GPU-hours)."""
    window = Window(start, end)
    assert window.range == promql
    queries = low_util_queries(window, Filters())
    assert f"offset {promql})" in queries["allocated_base"]
    assert f"[{promql}]" in queries["allocated"]


def test_selectors_quote_label_values() -> None:
    assert selector("m", {"user": 'a"b\\c'}) == 'm{user="a\\"b\\\\c"}'
    assert jobid_regex(["12", "13_4"]) == "12|13_4"
    with pytest.raises(ReportError):
        jobid_regex(['1"}'])


def test_low_util_query_count_and_filters_do_not_depend_on_jobs() -> None:
    window = Window(NOW - 86400, NOW)
    plain = low_util_queries(window, Filters())
    filtered = low_util_queries(window, Filters(user="bob", cluster="a"))
    assert len(plain) == len(filtered) == 9
    assert all('user="bob"' in q and 'cluster="a"' in q for q in filtered.values())


@pytest.mark.parametrize(("text", "seconds"), [
    ("01:00:00", 3600), ("2-00:00:00", 2 * 86400), ("30", 1800), ("05:30", 330),
    ("1-12", 86400 + 12 * 3600), ("UNLIMITED", None), ("Partition_Limit", None)])
def test_time_limits(text: str, seconds: float | None) -> None:
    assert parse_timelimit(text) == seconds


def test_requested_memory_per_job_node_or_cpu() -> None:
    assert parse_reqmem("16G", 8, 2) == 16 * 2**30
    assert parse_reqmem("16Gn", 8, 2) == 32 * 2**30
    assert parse_reqmem("2Gc", 8, 2) == 16 * 2**30
    assert parse_reqmem("4000M", None, None) == 4000 * 2**20
    assert parse_reqmem("", 1, 1) is None


def test_sacct_rows() -> None:
    out = ("101|COMPLETED|1-00:00:00|64G|16|1|2026-11-29T08:00:00|2026-11-29T10:00:00|0:0"
           "|physics|normal|billing=16,cpu=16,gres/gpu=4,mem=64G,node=1\n"
           "102|CANCELLED by 1001|02:00:00|4Gc|4|1|2026-11-29T08:00:00|Unknown|0:15"
           "|chemistry|normal|billing=4,cpu=4,mem=16G,node=1\n"
           "garbage\n")
    rows = parse_sacct(out)
    assert rows["101"].time_limit_s == 86400 and rows["101"].requested_memory == 64 * 2**30
    assert rows["101"].requested_gpus == 4 and rows["101"].exit_code == "0:0"
    assert rows["101"].account == "physics" and rows["101"].qos == "normal"
    assert rows["102"].state == "CANCELLED" and rows["102"].requested_memory == 16 * 2**30
    assert rows["102"].end is None and set(rows) == {"101", "102"}
    assert rows["102"].requested_gpus is None and rows["102"].exit_code == "0:15"
