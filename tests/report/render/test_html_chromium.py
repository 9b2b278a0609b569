"""The HTML report renders in a real browser (Debian's headless Chromium), offline."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from slurm_gpu_exporter.report.figures.rules import job_facts, load_config, notes_for
from slurm_gpu_exporter.report.render.html import job_html, low_util_html
from tests.report.sample_data import job_details, low_util_report
from tests.support import require

pytestmark = pytest.mark.process


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    require(found is not None, "chromium (Debian package chromium) is not installed")
    assert found is not None
    return found


def run_chromium(*args: str) -> subprocess.CompletedProcess[str]:
    # --no-sandbox: CI runs as root; no network is reachable or wanted.
    return subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", *args], capture_output=True, text=True,
                          timeout=90, check=False)


def test_low_util_html_renders_its_charts_in_chromium(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(low_util_html(low_util_report()))
    dom = run_chromium("--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    for chart in ('id="waste-by-user"', 'id="busy-distribution"', 'class="chart timeline"'):
        assert chart in html
    assert html.count("<svg") == 2 + len(low_util_report().timelines)
    assert html.count('class="bar"') >= 5 + 10  # a bar per user, a bar per bin
    shot = tmp_path / "report.png"
    result = run_chromium("--window-size=1100,1500", f"--screenshot={shot}", page.as_uri())
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_job_html_renders_in_chromium(tmp_path: Path) -> None:
    config = load_config(None)
    details = job_details()
    for detail in details:
        detail.notes = notes_for(job_facts(detail, config), config.notes)
    page = tmp_path / "job.html"
    page.write_text(job_html(details))
    dom = run_chromium("--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count('class="chart gpu-busy"') == 2
    assert "GPU never used" in dom.stdout


@pytest.mark.parametrize("render", [lambda: low_util_html(low_util_report())])
def test_html_needs_no_network(render) -> None:  # type: ignore[no-untyped-def]
    page = render()
    for needle in ("<script", "<link", "src=", "@import", "url("):
        assert needle not in page
