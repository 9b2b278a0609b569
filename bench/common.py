"""Helpers shared by the benchmarks: percentiles, the machine's yardstick and the results
file."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
# The yardstick: a fixed pure-Python loop, timed in the same run as the figures it goes
# with. A figure divided by it compares across machines (and across loads on one
# machine) far better than the figure alone: both are paid in the same interpreter on
# the same cores.
YARDSTICK_LOOPS = 1_000_000
YARDSTICK_RUNS = 5


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def _loop(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def yardstick() -> dict[str, float]:
    """The yardstick now: the loop's CPU and wall milliseconds (median of a few runs,
    and their spread) and the 1-minute load average."""
    cpu, wall = [], []
    for _ in range(YARDSTICK_RUNS):
        w0, c0 = time.perf_counter(), time.thread_time()
        _loop(YARDSTICK_LOOPS)
        cpu.append((time.thread_time() - c0) * 1000)
        wall.append((time.perf_counter() - w0) * 1000)
    return {"cpu_ms": round(percentile(cpu, 50), 1),
            "cpu_ms_min": round(min(cpu), 1), "cpu_ms_max": round(max(cpu), 1),
            "wall_ms": round(percentile(wall, 50), 1),
            "load_1m": round(os.getloadavg()[0], 2)}


# Taken when a benchmark starts (it imports this module first): record() adds one more
# at the end, so a results file says how the machine was on both sides of its figures.
_AT_START = yardstick()


def record(name: str, figures: dict[str, object]) -> None:
    """Print the figures and keep them in bench/results/<name>.json, with the yardstick
    and the load average at the start and at the end of the run."""
    data = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {platform.python_implementation()} "
                   f"{platform.python_version()}, {os.cpu_count()} CPUs",
        "yardstick": {"loop": f"sum(i * i % 7 for i in range({YARDSTICK_LOOPS})), "
                              "a for loop",
                      "start": _AT_START, "end": yardstick()},
        **figures,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    for key, value in figures.items():
        print(f"{key:40} {value}")
    print(f"{'yardstick (start, end)':40} {_AT_START}, {data['yardstick']['end']}")
