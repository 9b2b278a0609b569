"""``gpu-check --shared``: two jobs on one GPU, each with a load busy its own part of
every period.

Job A's load is busy the first ``--duty`` of every ``--period``, job B's the same share
half a period later (both aligned on the wall clock, so with a duty of 0.5 or less the
bursts never overlap). The driver's per-process samples split the GPU's busy time: a
correct agent gives each job its own load's duty, within the tolerance printed, and the
two jobs' busy seconds add up to the GPU's. GPM activity is not checked: a GPU shared
by two jobs gets no job activity counters (docs/metrics.md).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import gpu_check as gc

SHARED_JOBID = "990002"
# Beyond one job's own tolerance: each process sample is a whole percent of its period,
# and real drivers hand out about one sample per process per read, seconds old
# (docs/gpu-check.md), so a process's share of a burst may land in the next sample.
SPLIT_TOLERANCE = 0.02


def shared_tolerance(duty: float, period: float, window: float, spacing: float) -> float:
    """How far each sharing job's busy ratio may be from its load's duty."""
    return gc.busy_tolerance(duty, period, window, spacing) + SPLIT_TOLERANCE


def shared_rows(jobs: dict[str, dict[str, float | None]], duty: float, tolerance: float,
                gpu_busy_s: float | None, elapsed: float
                ) -> tuple[list[tuple[str, object]], bool]:
    """The table rows of the shared check and whether it passed: each job's busy ratio
    within ``tolerance`` of ``duty``; the jobs' busy seconds against the GPU's."""
    rows: list[tuple[str, object]] = []
    ok = True
    busy_s = 0.0
    for name, ratios in jobs.items():
        busy, allocated = ratios["busy"], ratios["allocated"]
        rows.append((f"job {name}: busy ratio (agent)", gc._fmt(busy)))
        if busy is None or allocated is None:
            ok = False
            continue
        rows.append((f"job {name}: busy error, percentage points", f"{100 * (busy - duty):+.2f}"))
        ok = ok and abs(busy - duty) <= tolerance
        busy_s += busy * allocated
    rows += [
        ("busy ratio (truth, each job)", f"{duty:.4f}"),
        ("busy tolerance, percentage points", f"±{100 * tolerance:.2f}"),
        ("jobs' busy seconds, together", f"{busy_s:.2f}"),
        ("GPU's busy seconds", None if gpu_busy_s is None else f"{gpu_busy_s:.2f}"),
        ("window", f"{elapsed:.1f} s"),
    ]
    return rows, ok


def check_shared(args: argparse.Namespace) -> int:
    if not 0 < args.duty <= 0.5:
        print("gpu-check: --shared needs --duty above 0 and at most 0.5 (the two loads' "
              "bursts must not overlap)", file=sys.stderr)
        return 2
    try:
        uuid, minor, name, _ = gc._gpu_identity(args.gpu)
    except Exception as exc:
        print(f"gpu-check: no usable NVIDIA GPU {args.gpu} here ({exc}); check the driver "
              "with nvidia-smi", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="sge-gpu-check-shared-"))
    jobs = {"A": gc.JOBID, "B": SHARED_JOBID}
    for jobid in jobs.values():
        gc.hold(work, jobid, minor)
    port = gc.free_port()
    agent = gc.start_agent(work, port, args.interval)
    labels = [{"jobid": jobid, "gpu": str(args.gpu)} for jobid in jobs.values()]
    loads: list[subprocess.Popen[str]] = []
    ok = False
    try:
        gc._wait(lambda: gc._ready(port, agent), 30, "the agent to be ready")
        for jobid, phase in zip(jobs.values(), (0.0, 0.5), strict=True):
            loads.append(gc._start_load(args, uuid, args.duty, 1, jobid=jobid, phase=phase)[0])
        first, second, elapsed = gc._measure(args, port, loads, labels)
        ratios = {n: gc.window_ratios(first, second, one)
                  for n, one in zip(jobs, labels, strict=True)}
        gpu_busy = gc._delta(first, second, "slurm_gpu_busy_seconds_total",
                             {"gpu": str(args.gpu)})
        tolerance = shared_tolerance(args.duty, args.period, elapsed, args.spacing)
        rows, ok = shared_rows(ratios, args.duty, tolerance, gpu_busy, elapsed)
        rows.insert(0, ("GPU", f"{args.gpu} {name} {uuid} (minor {minor}), shared by jobs "
                           f"{jobs['A']} and {jobs['B']}, each busy {args.duty:.0%} of "
                           f"{args.period:g} s, half a period apart"))
        gc.print_table(rows, args.json)
        return 0 if ok else 1
    except RuntimeError as exc:
        print(f"gpu-check: {exc}; the agent's log follows", file=sys.stderr)
        return 1
    finally:
        gc._stop(*loads, agent)
        if not ok:
            sys.stderr.write((work / "agent.log").read_text(errors="replace")[-20000:])
        print(f"(agent log: {work / 'agent.log'})")
