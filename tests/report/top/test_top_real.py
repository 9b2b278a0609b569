"""``slurm-gpu-report top JOBID`` against a real Prometheus holding a job with known
figures (backfilled with promtool, up to a few minutes past now so "now" is always the
last 15 s whatever the test's start-up took), and a job that ended."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import wait_until
from tests.support.daemons import Prometheus, tool

pytestmark = pytest.mark.prometheus

REPORT = str(Path(sys.executable).parent / "slurm-gpu-report")
STEP = 15
GIB = 1024**3
SWITCH_S = 2700  # GPU 0 is busier from 45 minutes into the job on
# GPU 0: busy 20 % then 80 %, SM active 10 % then 70 %, 300 W, 71 C. GPU 1: never busy,
# no SM figures (no GPM), 60 W, 40 C. The node's third GPU (not the job's): 99 C.
BUSY = ((0.2, 0.8), (0.0, 0.0))
SM = (0.1, 0.7)
POWER_W = (300.0, 60.0)
TEMP_C = {"GPU-a": 71, "GPU-b": 40, "GPU-c": 99}
CORES = 4.0
CPUS = 8


def _phase(t: int, start: int, pair: tuple[float, float]) -> float:
    """Seconds spent busy (at ``pair``'s shares) from ``start`` to ``t``."""
    first = min(t - start, SWITCH_S)
    return pair[0] * first + pair[1] * max(0, t - start - SWITCH_S)


def _openmetrics(start: int, stop: int) -> str:
    rows: dict[str, list[str]] = {}

    def add(key: str, line: str) -> None:
        rows.setdefault(key, []).append(line)

    inst = 'instance="gpu01:9817",job="slurm-gpu"'
    live = f'jobid="8880001",user="dana",{inst}'
    ended = f'jobid="8880002",user="erin",{inst}'
    for t in range(start, stop + 1, STEP):
        add("info", f'slurm_job_info{{{live},account="ml",partition="gpu",name="resnet"}} 1 {t}')
        add("start", f"slurm_job_start_time_seconds{{{live}}} {start} {t}")
        add("cpus", f"slurm_job_cpus{{{live}}} {CPUS} {t}")
        add("cpu", f"slurm_job_cpu_seconds_total{{{live}}} {CORES * (t - start)} {t}")
        add("mem", f"slurm_job_memory_used_bytes{{{live}}} {12 * GIB} {t}")
        add("peak", f"slurm_job_memory_peak_bytes{{{live}}} {14 * GIB} {t}")
        add("limit", f"slurm_job_memory_limit_bytes{{{live}}} {32 * GIB} {t}")
        for i, uuid in enumerate(("GPU-a", "GPU-b")):
            gpu = f'{live},gpu="{i}",uuid="{uuid}"'
            add("alloc", f"slurm_job_gpu_allocated_seconds_total{{{gpu}}} {t - start} {t}")
            add("busy", f"slurm_job_gpu_busy_seconds_total{{{gpu}}} "
                        f"{_phase(t, start, BUSY[i])} {t}")
            add("energy", f"slurm_job_gpu_energy_joules_total{{{gpu}}} "
                          f"{POWER_W[i] * (t - start)} {t}")
            add("gmem", f"slurm_job_gpu_memory_used_bytes{{{gpu}}} {(10 - 10 * i) * GIB} {t}")
            add("gpeak", f"slurm_job_gpu_memory_peak_bytes{{{gpu}}} {(12 - 12 * i) * GIB} {t}")
            if i == 0:
                add("sm", f"slurm_job_gpu_sm_active_seconds_total{{{gpu}}} "
                          f"{_phase(t, start, SM)} {t}")
        for i, (uuid, temp) in enumerate(TEMP_C.items()):
            add("temp", f'slurm_gpu_temperature_celsius{{{inst},gpu="{i}",uuid="{uuid}"}} '
                        f"{temp} {t}")
        if t <= start + 1800:  # the other job: half an hour, ended
            add("info", f'slurm_job_info{{{ended},account="bio",partition="gpu",name="fold"}}'
                        f" 1 {t}")
            add("start", f"slurm_job_start_time_seconds{{{ended}}} {start} {t}")
            add("end", f"slurm_job_end_time_seconds{{{ended}}} {start + 1800} {t}")
            add("alloc", f'slurm_job_gpu_allocated_seconds_total{{{ended},gpu="2",uuid="GPU-c"}} '
                         f"{t - start} {t}")
            add("busy", f'slurm_job_gpu_busy_seconds_total{{{ended},gpu="2",uuid="GPU-c"}} '
                        f"{0.9 * (t - start)} {t}")
    families = [("info", "slurm_job_info", "gauge"), ("start", "slurm_job_start_time_seconds",
                "gauge"), ("end", "slurm_job_end_time_seconds", "gauge"),
                ("cpus", "slurm_job_cpus", "gauge"), ("cpu", "slurm_job_cpu_seconds", "counter"),
                ("mem", "slurm_job_memory_used_bytes", "gauge"),
                ("peak", "slurm_job_memory_peak_bytes", "gauge"),
                ("limit", "slurm_job_memory_limit_bytes", "gauge"),
                ("alloc", "slurm_job_gpu_allocated_seconds", "counter"),
                ("busy", "slurm_job_gpu_busy_seconds", "counter"),
                ("energy", "slurm_job_gpu_energy_joules", "counter"),
                ("gmem", "slurm_job_gpu_memory_used_bytes", "gauge"),
                ("gpeak", "slurm_job_gpu_memory_peak_bytes", "gauge"),
                ("sm", "slurm_job_gpu_sm_active_seconds", "counter"),
                ("temp", "slurm_gpu_temperature_celsius", "gauge")]
    lines = []
    for key, family, kind in families:
        lines.append(f"# TYPE {family} {kind}")
        lines.extend(sorted(rows[key], key=_series_then_time))
    return "\n".join(lines) + "\n# EOF\n"


def _series_then_time(line: str) -> tuple[str, int]:
    """Each series' samples together, in time order (as promtool reads them)."""
    series, _, t = line.rpartition(" ")
    return series.rpartition(" ")[0], int(t)


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, int]]:
    work = tmp_path_factory.mktemp("top-prom")
    now = int(time.time()) // STEP * STEP
    start = now - 3600
    source = work / "backfill.om"
    source.write_text(_openmetrics(start, now + 600))
    subprocess.run([tool("promtool", package="prometheus"), "tsdb", "create-blocks-from",
                    "openmetrics", str(source), str(work / "data")],
                   check=True, capture_output=True, timeout=120)
    server = Prometheus("prometheus", {"global": {"scrape_interval": "15s"},
                                       "scrape_configs": []}, work)
    try:
        server.wait_ready()
        server.wait_for('slurm_job_info{jobid="8880001"}', timeout=60)
        yield server, start
    finally:
        server.stop()


def _top(prom: Prometheus, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([REPORT, "top", *args, "--prometheus-url", prom.url],
                          capture_output=True, text=True, timeout=120, check=False)


def _pct(cell: str) -> float:
    return float(cell.rstrip("%")) / 100


def test_once_shows_each_gpu_now_and_over_the_job_and_the_job_s_cpu_and_memory(
        prom: tuple[Prometheus, int]) -> None:
    server, start = prom
    before = time.time()
    done = _top(server, "8880001", "--once")
    elapsed = max(before, time.time()) - start
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("Job 8880001 (resnet)  user dana  run time 1h"), out
    rows = {m.group(1): m.group(2).split()
            for m in re.finditer(r"^\s*gpu01\s+(\d)\s+(.*)$", out, re.M)}
    assert set(rows) == {"0", "1"}, out
    gpu0, gpu1 = rows["0"], rows["1"]
    # Busy now, busy over the job, SM now, SM over the job.
    assert gpu0[0] == "80%" and gpu1[0] == "0%"
    assert _pct(gpu0[1]) == pytest.approx(_phase(int(elapsed) + start, start, BUSY[0])
                                          / elapsed, abs=0.015)
    assert gpu1[1] == "0%"
    assert gpu0[2] == "70%" and gpu1[2] == "-"
    assert _pct(gpu0[3]) == pytest.approx(_phase(int(elapsed) + start, start, SM) / elapsed,
                                          abs=0.015)
    assert gpu1[3] == "-"
    # GPU memory now and peak, the job's power now, the device's temperature.
    assert gpu0[4:] == ["10.0", "GiB", "12.0", "GiB", "300", "W", "71", "C"]
    assert gpu1[4:] == ["0.0", "GiB", "0.0", "GiB", "60", "W", "40", "C"]
    assert "99 C" not in out  # the node's GPU the job does not hold
    cpu = re.search(r"^CPU\s+(.*)$", out, re.M)
    mem = re.search(r"^Memory\s+(.*)$", out, re.M)
    assert cpu and cpu.group(1) == "4.0 cores busy now of 8 CPUs; 50% over the job"
    assert mem and mem.group(1) == "12.0 GiB now of 32.0 GiB; peak 14.0 GiB"
    assert "1 of the job's 2 GPUs were never used" in out  # the job report's notes
    assert "\x1b[" not in out  # not a terminal: no colour, no screen clearing


def test_a_job_that_ended_gets_its_summary_and_exit_0(prom: tuple[Prometheus, int]) -> None:
    server, start = prom
    done = _top(server, "8880002", "--interval", "1")
    assert done.returncode == 0, done.stderr
    assert "GPU busy" in done.stdout and "90.0%" in done.stdout  # the job report's summary
    assert done.stdout.rstrip().endswith("ended at "
                                         + time.strftime("%Y-%m-%d %H:%M UTC",
                                                         time.gmtime(start + 1800)) + ".")


def test_an_unknown_job_or_a_bad_interval_is_one_line_and_an_error(
        prom: tuple[Prometheus, int]) -> None:
    server, _ = prom
    unknown = _top(server, "99999999", "--once")
    assert unknown.returncode == 5 and "no metrics for job 99999999" in unknown.stderr
    fast = _top(server, "8880001", "--interval", "0.2")
    assert fast.returncode == 2 and "bad --interval 0.2" in fast.stderr
    bad = _top(server, "1;drop", "--once")
    assert bad.returncode == 2 and "bad job id" in bad.stderr


def test_a_running_job_is_redrawn_every_interval_until_interrupted(
        prom: tuple[Prometheus, int]) -> None:
    server, _ = prom
    # PYTHONFAULTHANDLER: were ^C ever not to end it, SIGABRT below shows where it was.
    proc = subprocess.Popen([REPORT, "top", "8880001", "--interval", "1", "--prometheus-url",
                             server.url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")),  # type: ignore[union-attr]
                              daemon=True)
    reader.start()
    try:
        frames = wait_until(
            lambda: [x for x in list(lines) if x.startswith("Job 8880001 (resnet)")][2:],
            60, "three frames of top", poll=0.2)
        assert frames
        assert any("every 1 s" in x for x in lines)
        proc.send_signal(signal.SIGINT)  # ^C: the way out of a live view
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # the faulthandler's stacks on stderr
            _, err = proc.communicate(timeout=30)
            raise AssertionError(f"top did not end 30 s after ^C; its stacks:\n{err}") from None
        assert code == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    assert proc.stderr is not None and proc.stderr.read() == ""
