"""Measuring a running agent from outside: its CPU time, RSS, samples and series.

The figures come from the agent process itself (/proc/<pid>/stat and status), so a
benchmark's own work (writing a synthetic node, a load tool) is not counted. CPU is
also split by thread (/proc/<pid>/task/<tid>/stat, names from ``py-spy dump``):
``sampler`` is the sample cycle; NVML reads run in one long-lived ``nvml-read``
thread (a short-lived one per read in code before issue 49's reader thread);
``xid-events`` waits for Xid events (the fake NVML polls its state file every 10 ms
there, which a real driver does not); ``MainThread`` serves HTTP. The machine's load
average goes with every figure: on a shared machine it says how far to trust it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# What Prometheus 2.x sends: OpenMetrics first, gzip.
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0;q=0.5,"
              "text/plain;version=0.0.4;q=0.4,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}
_TICK = os.sysconf("SC_CLK_TCK")
_LAST_SAMPLE = re.compile(rb"^slurm_gpu_exporter_last_sample_timestamp_seconds (\S+)$", re.M)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process (all its threads) so far."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each live thread of the process, by thread id."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = cpu_seconds_of(f"/proc/{pid}/task/{tid}/stat")
        except OSError:
            continue  # ended meanwhile
    return out


def cpu_seconds_of(stat_path: str) -> float:
    with open(stat_path, "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


_PY_SPY_THREAD = re.compile(r'^Thread (\d+) \((?:active|idle)[^)]*\): "([^"]+)"', re.M)


def thread_names(pid: int) -> dict[int, str]:
    """Python thread names by thread id (py-spy dump); {} without py-spy."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.path.exists(spy):
        return {}
    out = subprocess.run([spy, "dump", "--nonblocking", "-p", str(pid)], capture_output=True,
                         text=True, check=False).stdout
    return {int(tid): name for tid, name in _PY_SPY_THREAD.findall(out)}


def by_thread(pid: int, before: dict[int, float], after: dict[int, float], total: float,
              samples: int) -> dict[str, float]:
    """CPU ms per sample by Python thread name. What is not in a live thread was spent
    by threads that ended in between: per-read NVML threads, in code that has them."""
    names = thread_names(pid)
    shares: dict[str, float] = {}
    for tid, cpu in after.items():
        name = re.sub(r"_\d+$", "", names.get(tid, "other"))  # asyncio_0, asyncio_1...
        shares[name] = shares.get(name, 0.0) + cpu - before.get(tid, 0.0)
    shares["ended threads (nvml-read)"] = total - sum(shares.values())
    return {name: round(cpu * 1000 / samples, 2) for name, cpu in sorted(shares.items())}


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", "rb") as handle:
        for line in handle:
            if line.startswith(b"VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def load() -> float:
    """The 1-minute load average, rounded."""
    return round(os.getloadavg()[0], 2)


def get(url: str, headers: dict[str, str] | None = None) -> bytes:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read()


def last_sample(base_url: str) -> float:
    """The timestamp of the snapshot being served (one scrape)."""
    m = _LAST_SAMPLE.search(get(base_url + "/metrics"))
    assert m is not None, "no last-sample timestamp in the exposition"
    return float(m.group(1))


def series_count(base_url: str) -> int:
    body = get(base_url + "/metrics")
    return sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))


def wait_new_sample(base_url: str, after: float, timeout: float = 60.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ts = last_sample(base_url)
        if ts > after:
            return ts
        time.sleep(0.1)
    raise TimeoutError("the agent took no new sample")


def idle_cpu_per_sample(pid: int, base_url: str, interval: float, window: float
                        ) -> dict[str, float]:
    """CPU per sample over ``window`` seconds with no scrape in between.

    Scrapes only at both ends, to learn how many samples were taken; each scrape's own
    CPU is outside the window (read after the first answer, before the last request).
    """
    ts0 = wait_new_sample(base_url, last_sample(base_url))
    la0 = load()
    threads0 = thread_cpu(pid)
    cpu0 = cpu_seconds(pid)
    time.sleep(window)
    cpu1 = cpu_seconds(pid)
    threads1 = thread_cpu(pid)
    ts1 = last_sample(base_url)
    samples = max(1, round((ts1 - ts0) / interval))
    return {
        "cpu_ms_per_sample": round((cpu1 - cpu0) * 1000 / samples, 2),
        "cpu_ms_per_sample_by_thread": by_thread(pid, threads0, threads1, cpu1 - cpu0, samples),
        "samples": samples,
        "cpu_share_of_core_pct": round((cpu1 - cpu0) / window * 100, 3),
        "load_1m": round((la0 + load()) / 2, 2),
    }


def scrape_cpu(pid: int, base_url: str, interval: float, snapshots: int,
               repeat: int) -> dict[str, float]:
    """CPU of scrapes as Prometheus sends them: the first scrape of each new snapshot
    (which may have to render) and ``repeat`` more of the same snapshot (cached bytes).

    The agent's sampling CPU in between is not separated out, so these are upper
    bounds; with ``repeat`` large the repeated figure is dominated by serving."""
    first, again = [], []
    ts = last_sample(base_url)
    for _ in range(snapshots):
        ts = wait_new_sample(base_url, ts)
        c0 = cpu_seconds(pid)
        get(base_url + "/metrics", PROMETHEUS_HEADERS)
        c1 = cpu_seconds(pid)
        for _ in range(repeat):
            get(base_url + "/metrics", PROMETHEUS_HEADERS)
        c2 = cpu_seconds(pid)
        first.append(c1 - c0)
        again.append((c2 - c1) / max(1, repeat))
    return {
        "first_scrape_of_snapshot_cpu_ms": round(sum(first) / len(first) * 1000, 2),
        "repeat_scrape_cpu_ms": round(sum(again) / len(again) * 1000, 3),
        "load_1m": load(),
    }
