"""CPU of the jobs' cgroup reads (``CgroupFS.read_stats``) over real v1 cgroups (issue 49).

Makes ``--jobs`` job cgroups of its own (``sgeperf<pid>/job_<n>/step_{extern,batch}``
under cpuacct, memory, freezer, devices and cpuset; no process in them, no memory
limit) and removes them after. In process, ``time.thread_time()``: best of 5 rounds of
50 samples, each sample one ``read_stats`` per job, in ms per sample. The clock the
CgroupFS is given moves 5 s per sample (a default sample interval), so the steps are
past their young time and the cached files (cpuset, memory limit) are read as often as
in the agent; the held files' pid-list rule is given the same clock (the cost of the
reads, not the kernel's pid lists, is measured). Another checkout with ``--code DIR``.

    .venv/bin/python bench/read_stats.py [--jobs 64] [--code DIR] [--tag X]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from types import MappingProxyType

ROOT = Path(__file__).resolve().parents[1]
CTRLS = ("cpuacct", "memory", "freezer", "devices", "cpuset")
CGROUP = Path("/sys/fs/cgroup")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout to measure")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    sys.path.insert(0, str(args.code.resolve()))
    sys.path.insert(1, str(ROOT / "bench"))
    from common import record

    import slurm_gpu_exporter
    from slurm_gpu_exporter.node.cgroup import CgroupFS
    from slurm_gpu_exporter.node.cgroup.fs import JobCgroup

    if not str(slurm_gpu_exporter.__file__).startswith(str(args.code.resolve())):
        sys.exit(f"measured the wrong code: {slurm_gpu_exporter.__file__}")
    if not all((CGROUP / c).is_dir() for c in CTRLS):
        sys.exit(f"read_stats: needs the v1 hierarchies {', '.join(CTRLS)} under {CGROUP}")
    base = {c: CGROUP / c / f"sgeperf{os.getpid()}" for c in CTRLS}
    made: list[Path] = []
    try:
        jobs = []
        for ctrl, top in base.items():
            _make(top, made, copy_cpuset_from=top.parent if ctrl == "cpuset" else None)
        for n in range(args.jobs):
            dirs = {}
            for ctrl, top in base.items():
                job = top / f"job_{n}"
                _make(job, made, copy_cpuset_from=top if ctrl == "cpuset" else None)
                for step in ("step_extern", "step_batch"):
                    _make(job / step, made,
                          copy_cpuset_from=job if ctrl == "cpuset" else None)
                dirs[ctrl] = job
            jobs.append(JobCgroup(job_key=str(n), uid=0, is_sluid=False, version=1,
                                  dirs=MappingProxyType(dirs), more_dirs=()))
        now = [0.0]
        cgroups = CgroupFS(CGROUP, held_files=1024, clock=lambda: now[0])
        held = getattr(cgroups, "_held", None)
        if held is not None and hasattr(held, "_clock"):
            held._clock = lambda: now[0]
        for _ in range(4):  # past the steps' young time, as a running job's
            now[0] += 5.0
            for job in jobs:
                cgroups.read_stats(job)
        rounds = []
        for _ in range(5):
            start = time.thread_time()
            for _ in range(50):
                now[0] += 5.0
                for job in jobs:
                    cgroups.read_stats(job)
            rounds.append((time.thread_time() - start) / 50 * 1000)
        cgroups.close()
    finally:
        for path in reversed(made):
            try:
                path.rmdir()
            except OSError as exc:
                print(f"cannot remove {path}: {exc}", file=sys.stderr)
    record("read_stats" + (f"_{args.tag}" if args.tag else ""),
           {"command": "python bench/read_stats.py " + " ".join(sys.argv[1:]),
            "code": str(args.code), "jobs": args.jobs,
            "ms_per_sample_best": round(min(rounds), 2),
            "ms_per_sample_rounds": [round(r, 2) for r in rounds]})


def _make(path: Path, made: list[Path], copy_cpuset_from: Path | None) -> None:
    path.mkdir()
    made.append(path)
    if copy_cpuset_from is not None:  # a cpuset cgroup takes no task without these
        for name in ("cpuset.cpus", "cpuset.mems"):
            (path / name).write_text((copy_cpuset_from / name).read_text())


if __name__ == "__main__":
    main()
