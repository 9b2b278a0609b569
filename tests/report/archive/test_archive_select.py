"""Which jobs ``archive`` takes from the query answers: pure logic over Samples."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from slurm_gpu_exporter.report.archive.collect import _ended_everywhere, archive_queries
from slurm_gpu_exporter.report.archive.usage import month_window, spans_months
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.table import archived
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.prometheus.client import Sample
from slurm_gpu_exporter.report.prometheus.queries import Filters


def _s(jobid: str, instance: str, cluster: str = "", value: float = 1.0) -> Sample:
    labels = {"jobid": jobid, "instance": instance}
    if cluster:
        labels["cluster"] = cluster
    return Sample(labels, value)


def test_a_job_is_archived_only_once_every_node_it_ran_on_has_sampled_its_end() -> None:
    got = {
        "info": [_s("1", "a:9400"), _s("1", "b:9400"), _s("2", "a:9400"), _s("3", "a:9400"),
                 _s("3", "a:9400", cluster="east")],
        "end": [_s("1", "a:9400"), _s("2", "a:9400"), _s("3", "a:9400", cluster="east")],
    }
    # Job 1 still runs on b; job 3 of the unlabelled cluster has not ended.
    assert _ended_everywhere(got, "cluster") == {("", "2"), ("east", "3")}


def test_archive_makes_the_same_queries_whatever_the_jobs_and_needs_no_baseline() -> None:
    queries = archive_queries(Window(0, 7200), Filters(cluster="east"))
    # info, the figures the archive keeps (figures/table.py), the GPUs' models, and
    # their slow-downs and errors (version 5 on): 18 with the table of version 5
    assert len(queries) == 3 + len(archived())
    assert all("offset" not in q for q in queries.values())
    assert all('cluster="east"' in q for q in queries.values())


def test_a_month_is_its_utc_days_cut_at_now_and_a_future_one_is_refused() -> None:
    def t(*args: int) -> float:
        return datetime(*args, tzinfo=UTC).timestamp()

    now = t(2026, 12, 15)
    assert month_window("2026-11", now) == Window(t(2026, 11, 1), t(2026, 12, 1))
    assert month_window("2025-12", now) == Window(t(2025, 12, 1), t(2026, 1, 1))
    assert month_window("2026-12", now) == Window(t(2026, 12, 1), now)
    for bad in ("2027-01", "2026-13", "nov"):
        with pytest.raises(ReportError):
            month_window(bad, now)
    assert not spans_months(month_window("2026-11", now))
    assert spans_months(Window(t(2026, 11, 30), t(2026, 12, 2)))
