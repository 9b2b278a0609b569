"""Job churn on a synthetic node: prolog records, cgroups and processes come and go."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from slurm_gpu_exporter.sim.synthnode import CONTROLLERS, SynthNode


def end_job(node: SynthNode, jobid: int) -> None:
    """What the epilog and slurmd leave: an ended record, no cgroups, no processes."""
    job = node.jobs.pop(jobid)
    job.end_time = time.time()
    node.write_record(job)
    for ctrl in CONTROLLERS:
        shutil.rmtree(node.job_dir(ctrl, job), ignore_errors=True)
    for pid in job.pids:
        shutil.rmtree(node.proc_root / str(pid), ignore_errors=True)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def open_files(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))
