"""The admins' review for real: ``slurm-gpu-report low-util --report-to … --smtp …
--out-dir …`` against a real Prometheus holding known jobs (backfilled with promtool),
a real SMTP server (aiosmtpd) on 127.0.0.1, and the mailed page rendered by headless
Chromium."""

from __future__ import annotations

import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path

import pytest

from tests.report.render.test_html_chromium import run_chromium
from tests.support import free_port
from tests.support.daemons import Prometheus, tool

pytestmark = pytest.mark.prometheus

REPORT = str(Path(sys.executable).parent / "slurm-gpu-report")
HOUR = 3600
ADMINS = ("gpu-admins@example.org", "ops@example.org")
HOSTILE = "<img src=x onerror=alert(1)>"
# jobid -> (user, name, GPUs, busy share of each GPU): two under the 25 % threshold.
JOBS = {
    "7770001": ("alice", "idle-notebook", 2, 0.0),
    "7770002": ("bob", HOSTILE, 1, 0.10),
    "7770003": ("carol", "train-llm", 1, 0.90),
}
FLAGGED = ("7770001", "7770002")


def _openmetrics(start: int) -> str:
    """Each job's series every 15 s over two hours, ending an hour before now."""
    rows: dict[str, list[str]] = {}
    for jobid, (user, name, gpus, busy) in JOBS.items():
        job = (f'jobid="{jobid}",user="{user}",instance="gpu01:9817",job="slurm-gpu"')
        quoted = name.replace("\\", "\\\\").replace('"', '\\"')
        for t in range(start, start + 2 * HOUR + 1, 15):
            rows.setdefault("info", []).append(
                f'slurm_job_info{{{job},account="ml",partition="gpu",name="{quoted}"}} 1 {t}')
            rows.setdefault("gpus", []).append(f"slurm_job_gpus{{{job}}} {gpus} {t}")
            for gpu in range(gpus):
                labels = f'{job},gpu="{gpu}",uuid="GPU-{jobid}-{gpu}"'
                rows.setdefault("alloc", []).append(
                    f"slurm_job_gpu_allocated_seconds_total{{{labels}}} {t - start} {t}")
                rows.setdefault("busy", []).append(
                    f"slurm_job_gpu_busy_seconds_total{{{labels}}} {busy * (t - start)} {t}")
    lines = []
    for key, family, kind in (("info", "slurm_job_info", "gauge"),
                              ("gpus", "slurm_job_gpus", "gauge"),
                              ("alloc", "slurm_job_gpu_allocated_seconds", "counter"),
                              ("busy", "slurm_job_gpu_busy_seconds", "counter")):
        lines.append(f"# TYPE {family} {kind}")
        lines.extend(rows[key])
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    work = tmp_path_factory.mktemp("review-prom")
    start = (int(time.time()) - 4 * HOUR) // 60 * 60
    source = work / "backfill.om"
    source.write_text(_openmetrics(start))
    subprocess.run([tool("promtool", package="prometheus"), "tsdb", "create-blocks-from",
                    "openmetrics", str(source), str(work / "data")],
                   check=True, capture_output=True, timeout=120)
    server = Prometheus("prometheus", {"global": {"scrape_interval": "15s"},
                                       "scrape_configs": []}, work)
    try:
        server.wait_ready()
        server.wait_for('slurm_job_info{jobid="7770003"}[6h]', timeout=60)
        yield server
    finally:
        server.stop()


@pytest.fixture
def smtp_server() -> Iterator[tuple[int, list[tuple[list[str], bytes]]]]:
    """A real SMTP server on 127.0.0.1: its port and each mail's envelope and bytes."""
    from aiosmtpd.controller import Controller

    got: list[tuple[list[str], bytes]] = []

    class Handler:
        async def handle_DATA(self, server, session, envelope):  # type: ignore[no-untyped-def]
            got.append((list(envelope.rcpt_tos), envelope.content))
            return "250 OK"

    controller = Controller(Handler(), hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        yield controller.port, got
    finally:
        controller.stop()


def _review(prom: Prometheus, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([REPORT, "low-util", "--since", "6h", "--threshold", "0.25",
                           "--prometheus-url", prom.url, *args],
                          capture_output=True, text=True, timeout=120, check=False)


def _days(before: float, after: float) -> set[str]:
    return {datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d") for t in (before, after)}


def test_the_review_is_mailed_to_the_admins_and_written_and_renders(
        prom: Prometheus, smtp_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    port, got = smtp_server
    out_dir = tmp_path / "reviews"
    before = time.time()
    done = _review(prom, "--report-to", ",".join(ADMINS), "--smtp",
                   f"smtp://127.0.0.1:{port}", "--out-dir", str(out_dir),
                   "--mail-from", "slurm-gpu-report@example.org")
    assert done.returncode == 0, done.stderr
    assert f"sent the review (2 flagged jobs) to {', '.join(ADMINS)}" in done.stdout

    (envelope, raw), = got
    assert envelope == list(ADMINS)
    mail = message_from_bytes(raw, policy=policy.default)
    assert isinstance(mail, EmailMessage)
    assert mail.get_content_type() == "multipart/alternative"
    assert mail["Subject"].startswith("GPU review: 2 of 3 jobs under 25% busy, ")
    # SMTP carries lines ended by CRLF: compared with the file as lines.
    parts = {p.get_content_type(): p.get_content().replace("\r\n", "\n")
             for p in mail.iter_parts()}
    assert set(parts) == {"text/plain", "text/html"}
    for jobid in FLAGGED:
        assert jobid in parts["text/plain"] and f">{jobid}<" in parts["text/html"]
    assert "7770003" not in parts["text/plain"] and "7770003" not in parts["text/html"]
    assert HOSTILE not in parts["text/html"] and "&lt;img src=x" in parts["text/html"]

    (written,) = out_dir.iterdir()
    assert written.name in {f"low-util-{d}.html" for d in _days(before, time.time())}
    assert stat.S_IMODE(written.stat().st_mode) == 0o640
    assert written.read_text() == parts["text/html"]

    dom = run_chromium("--dump-dom", written.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    for jobid in FLAGGED:
        assert f">{jobid}</td>" in dom.stdout
    assert "<img" not in dom.stdout  # the hostile name stayed text
    assert dom.stdout.count("<svg") == 2 + len(FLAGGED)  # two charts, a timeline each
    shot = tmp_path / "review.png"
    shown = run_chromium("--window-size=1100,1400", f"--screenshot={shot}", written.as_uri())
    assert shown.returncode == 0, shown.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(png[16:20], "big") == 1100  # IHDR width: the page was drawn
    assert len(png) > 20_000  # charts and tables, not a blank page


def test_a_mail_server_that_is_down_exits_6_and_the_file_is_still_written(
        prom: Prometheus, tmp_path: Path) -> None:
    out_dir = tmp_path / "reviews"
    done = _review(prom, "--report-to", ADMINS[0], "--smtp", f"smtp://127.0.0.1:{free_port()}",
                   "--out-dir", str(out_dir))
    assert done.returncode == 6, done.stderr
    (written,) = out_dir.iterdir()
    assert done.stderr.count("\n") == 1
    assert "cannot send mail to gpu-admins@example.org" in done.stderr
    assert f"the review is in {written}" in done.stderr
    for jobid in FLAGGED:
        assert f">{jobid}<" in written.read_text()
