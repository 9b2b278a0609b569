"""``job``, ``low-util``, ``archive`` and ``usage`` end to end over a stand-in
Prometheus (``fake_prometheus``) and a real SQLite archive, against checked-in files:
the PromQL each command sends, every output format, the archive's rows, the MLflow
metrics and the mail's summary.

Regenerate after an intended change with
``UPDATE_GOLDEN=1 .venv/bin/pytest tests/report/pipeline`` and review the diff.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select

from slurm_gpu_exporter.mail.summary import summary_text
from slurm_gpu_exporter.report.archive.collect import collect
from slurm_gpu_exporter.report.archive.schema import gpus, jobs, usage_monthly
from slurm_gpu_exporter.report.archive.store import ArchiveStore
from slurm_gpu_exporter.report.archive.usage import usage_report
from slurm_gpu_exporter.report.cli.reports import job_report, low_util_report
from slurm_gpu_exporter.report.figures.rules import Config, load_config
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.mlflow.figures import run_metrics
from slurm_gpu_exporter.report.prometheus.queries import Filters
from slurm_gpu_exporter.report.render import html, text
from slurm_gpu_exporter.report.render.usage import render_usage
from tests.report.pipeline.fake_prometheus import END, FakePrometheus, H

GOLDEN = Path(__file__).parent / "golden"
WINDOW = Window(END - 24 * H, END)
JOBIDS = ["501", "502", "503"]
ARCHIVED_AT = END + 60.0


def config() -> Config:
    return dataclasses.replace(load_config(None), emissions_gco2e_per_kwh=250.0)


def check(name: str, produced: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(produced)
    assert path.exists(), f"no golden file {path}: run with UPDATE_GOLDEN=1"
    assert produced == path.read_text(), name


def _job() -> tuple[FakePrometheus, list[Any]]:
    prom = FakePrometheus(WINDOW.start)
    details, unknown = asyncio.run(job_report(prom, WINDOW, JOBIDS, Filters(), config(),
                                              lambda ids: {}, END))  # type: ignore[arg-type]
    assert not unknown
    return prom, details


def _low_util() -> tuple[FakePrometheus, Any]:
    prom = FakePrometheus(WINDOW.start)
    report = asyncio.run(low_util_report(prom, WINDOW, Filters(), 0.5, 0.0,  # type: ignore[arg-type]
                                         chart_jobs=2))
    return prom, report


def _archive(path: Path) -> tuple[FakePrometheus, str]:
    prom = FakePrometheus(WINDOW.start)
    records = asyncio.run(collect(prom, WINDOW, Filters(), config(),  # type: ignore[arg-type]
                                  lambda window: {}))
    url = f"sqlite:///{path}"
    with ArchiveStore(url, write=True) as store:
        store.store(records, ARCHIVED_AT)
        store.store(records, ARCHIVED_AT + 60)  # again: counters only grow, roll-up kept
        assert store.inconsistent() == []
    return prom, url


def test_queries_sent_match_the_golden_file(tmp_path: Path) -> None:
    sent = {"job": _job()[0].sent, "low-util": _low_util()[0].sent,
            "archive": _archive(tmp_path / "a.sqlite")[0].sent}
    counts = {name: len(queries) for name, queries in sent.items()}
    check("queries.json", json.dumps({"counts": counts, "queries": sent}, indent=1) + "\n")


@pytest.mark.parametrize("fmt", ["txt", "csv", "json", "md", "html", "mlflow", "mail"])
def test_job_outputs_match_the_golden_files(fmt: str) -> None:
    prom, details = _job()
    produced = {
        "txt": lambda: text.job_table(details),
        "csv": lambda: text.job_csv(details),
        "json": lambda: text.job_json(details, prom.queries),
        "md": lambda: text.job_markdown(details),
        "html": lambda: html.job_html(details),
        "mlflow": lambda: json.dumps({d.usage.jobid: run_metrics(d) for d in details},
                                     indent=1, sort_keys=True) + "\n",
        "mail": lambda: "\n".join(summary_text(j) for j in
                                  json.loads(text.job_json(details, prom.queries))["jobs"]),
    }[fmt]()
    check(f"job.{fmt}", produced)


@pytest.mark.parametrize("fmt", ["txt", "csv", "json", "md", "html"])
def test_low_util_outputs_match_the_golden_files(fmt: str) -> None:
    _, report = _low_util()
    produced = {"txt": text.low_util_table, "csv": text.low_util_csv,
                "json": text.low_util_json, "md": text.low_util_markdown,
                "html": html.low_util_html}[fmt](report)
    check(f"low_util.{fmt}", produced)


def _rows(url: str) -> str:
    engine = create_engine(url)
    with engine.connect() as conn:
        tables = {t.name: [dict(r) for r in conn.execute(select(t)).mappings()]
                  for t in (jobs, gpus, usage_monthly)}
    engine.dispose()
    return json.dumps(tables, indent=1, sort_keys=True) + "\n"


def test_archive_rows_and_archived_job_match_the_golden_files(tmp_path: Path) -> None:
    _, url = _archive(tmp_path / "a.sqlite")
    check("archive_rows.json", _rows(url))
    with ArchiveStore(url, write=False) as store:
        found = store.details(JOBIDS)
    details = [found[j][0][0] for j in JOBIDS if j in found]
    check("archived_job.json", text.job_json(details, 0))
    check("archived_job.mlflow", json.dumps({d.usage.jobid: run_metrics(d) for d in details},
                                            indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize("fmt", ["table", "csv", "json", "markdown", "html"])
def test_usage_outputs_match_the_golden_files(tmp_path: Path, fmt: str) -> None:
    _, url = _archive(tmp_path / "a.sqlite")
    month = Window(1_793_491_200.0, 1_796_083_200.0)  # November 2026: the roll-up
    with ArchiveStore(url, write=False) as store:
        by_month = usage_report(store, month, ["account"])
        edge = usage_report(store, Window(END - 3 * 86400, END + 86400), ["user", "partition"])
    for report in (by_month, edge):
        report.source = "sqlite:///archive.sqlite"
    check(f"usage_month.{fmt}", render_usage(by_month, fmt))
    check(f"usage_edge.{fmt}", render_usage(edge, fmt))


def test_an_archive_made_before_the_figure_table_opens_and_reads_the_same(
        tmp_path: Path) -> None:
    """``archive_v5.sqlite`` was written by the code before the figure table: it opens
    with today's (migrating where the schema moved on) and reads back the same jobs."""
    path = tmp_path / "old.sqlite"
    path.write_bytes((GOLDEN / "archive_v5.sqlite").read_bytes())
    path.chmod(0o600)
    with ArchiveStore(f"sqlite:///{path}", write=True) as store:
        found = store.details(JOBIDS)
        assert store.inconsistent() == []
    details = [found[j][0][0] for j in JOBIDS if j in found]
    check("archived_job.json", text.job_json(details, 0))
