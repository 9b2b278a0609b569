"""What slowed a job's GPUs and what went wrong on them, against a real Prometheus: a
two-GPU job's counters (throttled seconds by reason, an Xid 79 with its time, ECC
errors, zero PCIe replays) are backfilled with promtool as the agent exports them, and
``job`` (JSON and text), the end-of-job mail's summary, ``low-util``, ``archive`` and
the job dashboard's new queries are checked against the truths they were made from.
The figures' arithmetic alone is tested in test_gpu_events.py (fast tier)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.support.daemons import DEPLOY, Prometheus, tool
from tests.system.observe import grafana

pytestmark = pytest.mark.prometheus

REPORT = str(Path(sys.executable).parent / "slurm-gpu-report")
HOUR = 3600
STEP = 15
BUSY = {"0": 0.5, "1": 0.8}  # each GPU's busy share of the job's two hours
POWER = {"0": 0.0, "1": 0.23}  # power-capped share of each GPU's busy time
IDLE_CLOCKS = 0.9  # low_utilization: this share of each GPU's idle time
XID_AT = HOUR + 3 * 60  # an Xid 79 on GPU 1, 63 minutes into the job
# The low-util job: 5 % busy on one GPU, thermally throttled 60 % of that.
SLOW_BUSY, SLOW_THERMAL = 0.05, 0.6


def _openmetrics(start: int) -> str:
    """Jobs 301 (two GPUs) and 302 (one GPU) every 15 s over their two hours."""
    rows: dict[str, list[str]] = {}

    def add(family: str, labels: str, value: float, t: int) -> None:
        rows.setdefault(family, []).append(f"{family}{{{labels}}} {value} {t}")

    for t in range(start, start + 2 * HOUR + 1, STEP):
        held = t - start
        for jobid, gpus in (("301", ("0", "1")), ("302", ("2",))):
            job = f'jobid="{jobid}",user="alice",instance="gpu01:9817",job="slurm-gpu"'
            add("slurm_job_info", job, 1, t)
            add("slurm_job_start_time_seconds", job, start, t)
            add("slurm_job_end_time_seconds", job, start + 2 * HOUR, t)
            for gpu in gpus:
                labels = f'{job},gpu="{gpu}",uuid="GPU-{gpu}"'
                busy = held * (BUSY.get(gpu, SLOW_BUSY))
                power = busy * POWER.get(gpu, 0.0)
                thermal = busy * SLOW_THERMAL if jobid == "302" else 0.0
                add("slurm_job_gpu_allocated_seconds_total", labels, held, t)
                add("slurm_job_gpu_busy_seconds_total", labels, busy, t)
                for reason, value in (("power", power), ("thermal", thermal),
                                      ("low_utilization", (held - busy) * IDLE_CLOCKS)):
                    add("slurm_job_gpu_throttled_seconds_total",
                        f'{labels},reason="{reason}"', value, t)
                if jobid == "301":
                    add("slurm_job_gpu_pcie_replays_total", labels, 0, t)
                if gpu == "1" and held >= XID_AT:
                    add("slurm_job_gpu_xid_errors_total", f'{labels},xid="79"', 1, t)
                    add("slurm_job_gpu_xid_last_timestamp_seconds", f'{labels},xid="79"',
                        start + XID_AT, t)
                    add("slurm_job_gpu_ecc_errors_total", f'{labels},type="uncorrected"', 2,
                        t)
    kinds = {"slurm_job_info": "gauge", "slurm_job_start_time_seconds": "gauge",
             "slurm_job_end_time_seconds": "gauge",
             "slurm_job_gpu_xid_last_timestamp_seconds": "gauge"}
    lines = []
    for family, samples in rows.items():  # each family's samples together, in time order
        kind = kinds.get(family, "counter")
        name = family.removesuffix("_total") if kind == "counter" else family
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(sorted(samples, key=lambda s: int(s.rsplit(" ", 1)[1])))
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, int]]:
    work = tmp_path_factory.mktemp("gpu-events-prom")
    start = (int(time.time()) - 5 * HOUR) // 60 * 60
    source = work / "backfill.om"
    source.write_text(_openmetrics(start))
    subprocess.run([tool("promtool", package="prometheus"), "tsdb", "create-blocks-from",
                    "openmetrics", str(source), str(work / "data")],
                   check=True, capture_output=True, timeout=120)
    server = Prometheus("prometheus", {"global": {"scrape_interval": "15s"},
                                       "scrape_configs": []}, work,
                        extra_args=("--storage.tsdb.retention.time=30d",))
    try:
        server.wait_ready()
        server.wait_for('slurm_job_gpu_throttled_seconds_total{jobid="301"}[6h]', timeout=60)
        yield server, start
    finally:
        server.stop()


def _report(server: Prometheus, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([REPORT, *args, "--prometheus-url", server.url],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done


def _window(start: int, since: int = 0) -> list[str]:
    return ["--start", str(start + since - 600 * (since == 0)), "--end",
            str(start + 2 * HOUR + 600)]


def test_the_job_report_shows_each_gpus_throttled_share_and_its_xid_with_its_time(
        prom: tuple[Prometheus, int]) -> None:
    server, start = prom
    data = json.loads(_report(server, "job", "301", *_window(start), "--no-sacct",
                              "--format", "json").stdout)
    (job,) = data["jobs"]
    gpus = {g["gpu"]: g for g in job["gpus_detail"]}
    power = gpus["1"]["throttled"]["power"]
    assert power["busy_ratio"] == pytest.approx(POWER["1"], abs=0.002)
    assert power["held_ratio"] == pytest.approx(POWER["1"] * BUSY["1"], abs=0.002)
    assert gpus["1"]["throttled"]["low_utilization"]["held_ratio"] == pytest.approx(
        IDLE_CLOCKS * (1 - BUSY["1"]), abs=0.002)
    assert set(gpus["0"]["throttled"]) == {"power", "thermal", "low_utilization"}
    assert gpus["0"]["slowed_ratio"] == 0.0
    assert gpus["1"]["errors"] == [
        {"kind": "xid", "detail": "79", "count": 1.0, "last": float(start + XID_AT)},
        {"kind": "ecc", "detail": "uncorrected", "count": 2.0, "last": None}]
    assert gpus["0"]["errors"] == []  # its PCIe replays stayed at 0
    at = datetime.fromtimestamp(start + XID_AT, UTC).strftime("%H:%M UTC")
    assert job["gpu_errors"] == [f"Xid 79 at {at} on GPU 1", "2 ECC errors (uncorrected) on GPU 1"]
    assert job["gpu_throttled"][1].startswith("GPU 1: power-capped 23% of its busy time (18% of "
                                           "the time held)")
    assert any(n.startswith("GPU 1 was power-capped 23% of the time it was busy")
               for n in job["notes"])
    assert any(f"Xid 79 at {at} on GPU 1" in n for n in job["notes"])
    # the same queries for two jobs: the events are one batched query (two with the
    # baseline), whatever the jobs, GPUs and errors
    both = json.loads(_report(server, "job", "301", "302", *_window(start), "--no-sacct",
                              "--format", "json").stdout)
    assert len(both["jobs"]) == 2 and both["queries"] == data["queries"]
    text = _report(server, "job", "301", *_window(start), "--no-sacct").stdout
    assert "GPU 1 throttled" in text and f"Xid 79 at {at} on GPU 1" in text


def test_a_window_that_starts_inside_the_job_counts_only_its_own_throttled_time(
        prom: tuple[Prometheus, int]) -> None:
    server, start = prom
    (job,) = json.loads(_report(server, "job", "301", *_window(start, since=HOUR + 600),
                                "--no-sacct", "--format", "json").stdout)["jobs"]
    gpu = next(g for g in job["gpus_detail"] if g["gpu"] == "1")
    assert gpu["allocated_hours"] == pytest.approx((HOUR - 600) / HOUR, abs=0.01)
    assert gpu["throttled"]["power"]["seconds"] == pytest.approx(
        (HOUR - 600) * BUSY["1"] * POWER["1"], rel=0.01)
    assert gpu["errors"] == []  # the Xid came before the window


def test_the_end_of_job_mail_summary_has_the_slowed_and_error_lines(
        prom: tuple[Prometheus, int]) -> None:
    from slurm_gpu_exporter.mail.config import MailConfig
    from slurm_gpu_exporter.mail.summary import report_json, summary_text

    server, start = prom
    config = MailConfig(report=REPORT, prometheus_url=server.url,
                        report_args=(*_window(start), "--no-sacct"))
    text = summary_text(report_json(config, "301", timeout_s=60))
    at = datetime.fromtimestamp(start + XID_AT, UTC).strftime("%H:%M UTC")
    assert any(line.split()[:3] == ["GPU", "throttled:", "GPU"] and "GPU 1: power-capped 23% "
               "of its busy time" in line for line in text.splitlines())
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert f"GPU error: Xid 79 at {at} on GPU 1" in lines
    assert "GPU 1 was power-capped 23% of the time it was busy" in text


def test_low_util_marks_the_job_slowed_by_its_gpu_rather_than_idle(
        prom: tuple[Prometheus, int]) -> None:
    server, start = prom
    data = json.loads(_report(server, "low-util", *_window(start), "--threshold", "0.3",
                              "--format", "json").stdout)
    flagged = {j["job"]: j for j in data["flagged"]}
    assert set(flagged) == {"302"}  # 301 is 50 % and 80 % busy
    assert flagged["302"]["slowed_reason"] == "thermal"
    assert flagged["302"]["slowed_ratio"] == pytest.approx(SLOW_THERMAL, abs=0.01)
    assert flagged["302"]["note"] == ("slowed by its GPU rather than idle: thermally "
                                      "throttled 60% of its busy GPU time")


def test_the_archive_keeps_the_throttled_seconds_and_the_xid(prom: tuple[Prometheus, int],
                                                              tmp_path: Path) -> None:
    from sqlalchemy import create_engine, text

    from slurm_gpu_exporter.report.archive.store import ArchiveStore

    server, start = prom
    db = f"sqlite:///{tmp_path / 'archive.sqlite'}"
    _report(server, "archive", *_window(start), "--no-sacct", "--db", db)
    engine = create_engine(db)
    with engine.connect() as conn:
        row = conn.execute(text("SELECT throttled, xid_errors, gpu_errors FROM archive_jobs "
                                "WHERE jobid = '301'")).one()
    engine.dispose()
    held = 2 * HOUR
    assert json.loads(row[0])["power"] == pytest.approx(held * BUSY["1"] * POWER["1"],
                                                        rel=0.01)
    assert row[1] == 1.0
    assert json.loads(row[2]) == {"xid:79": 1.0, "ecc:uncorrected": 2.0}
    with ArchiveStore(db, write=False) as store:
        ((detail, _),) = store.details(["301"])["301"]
    assert detail.nodes[0].gpus[1].faults[0].last == float(start + XID_AT)
    # a window Prometheus has nothing in: the job comes from the archive, its lines too
    shown = json.loads(_report(server, "job", "301", "--start", str(start - 3 * HOUR),
                               "--end", str(start - 2 * HOUR), "--db", db, "--format",
                               "json").stdout)["jobs"][0]
    assert any("From the job archive" in n for n in shown["notes"])
    assert shown["gpu_errors"][0].startswith("Xid 79 at ")
    assert shown["gpu_throttled"][1].startswith("GPU 1: power-capped 23% of its busy time")


def test_the_job_dashboards_gpu_event_queries_answer(prom: tuple[Prometheus, int]) -> None:
    server, start = prom
    board = grafana.load(DEPLOY / "grafana" / "dashboards" / "slurm-gpu-job.json")
    wanted = [t for t in grafana.targets(board) if "throttled" in t.expr or "xid" in t.expr]
    assert len(wanted) >= 3
    values = {"cluster": ".*", "jobid": "301"}
    end = start + 2 * HOUR + 60
    for target in wanted:
        result = grafana.run(server, target, values, start, end)
        assert result, f"{target.where()}: no data"
    expr = grafana.fill(board["annotations"]["list"][0]["expr"], values, 60)
    (mark,) = server.query(expr, at=end)["data"]["result"]
    assert float(mark["value"][1]) == (start + XID_AT) * 1000
