"""Where one sample's CPU goes, in-process: the agent's sampler as agent/cli.py wires it,
over a real node's cgroups and spool (the test cluster's, or any), the fake NVML.

Each ``Sampler.sample_once`` runs in this process's main thread, timed by step with
``time.thread_time`` (the NVML reads run on the reader thread and are counted
apart, as the process CPU minus this thread's), and profiled with cProfile: the top
functions by own time and by inclusive time go into the results file. Read-only: the
spool and cgroups are only read, the state dir is a temporary one.

    .venv/bin/python bench/cycle_profile.py [--cgroup-root /sys/fs/cgroup]
        [--spool-dir DIR] [--gpus 4] [--samples 30] [--interval 1] [--tag X]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# bench/ (this script's directory, first on sys.path) holds profile.py, which would
# stand in for the standard library's profile module that cProfile imports.
_HERE = sys.path.pop(0)
import cProfile  # noqa: E402
import pstats  # noqa: E402

sys.path.insert(0, _HERE)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from common import percentile, record, yardstick  # noqa: E402

TOP = 30


def child(args: argparse.Namespace, tmp: Path) -> None:
    from slurm_gpu_exporter.gpu.nvml.backend import NvmlBackend
    from slurm_gpu_exporter.gpu.source import GpuSampler
    from slurm_gpu_exporter.jobs.stats import JobStatsCollector
    from slurm_gpu_exporter.jobs.tracker import JobTracker
    from slurm_gpu_exporter.node.cgroup import CgroupFS
    from slurm_gpu_exporter.node.slurm.lookup import SlurmMetadata, make_lookup
    from slurm_gpu_exporter.node.source_health import SourceErrors
    from slurm_gpu_exporter.node.state_dir import StateStore
    from slurm_gpu_exporter.sampling.sampler import Sampler
    from slurm_gpu_exporter.training_relay.listener import TrainingRelay
    from slurm_gpu_exporter.training_relay.source import RelayJobs, TrainingSource
    from slurm_gpu_exporter.web.server import ExpositionHolder

    errors = SourceErrors()
    proc = Path("/proc")
    cgroups = CgroupFS(Path(args.cgroup_root), held_files=1024)
    lookup = make_lookup(args.node_name, prefer_pyslurm=False) if args.node_name else None
    tracker = JobTracker(args.spool_dir, cgroups, SlurmMetadata(lookup, errors=errors),
                          errors, proc_root=proc, trusted_uids=frozenset({0, os.geteuid()}))
    jobstats = JobStatsCollector(cgroups, proc, errors)
    gpu = GpuSampler(NvmlBackend(), proc, errors, cgroups=cgroups,
                     poll_timeout=max(1.0, 0.8 * args.interval))
    # The relay's socket in a spool of its own: the node's spool is only read.
    jobs = RelayJobs(proc, cgroups)
    relay = TrainingRelay(str(tmp / "relay"), jobs.job_of_pid, job_of_key=jobs.job_of_key)
    os.makedirs(tmp / "relay", mode=0o700)
    relay.start()
    training = TrainingSource(relay, jobs, errors)
    sampler = Sampler([tracker, jobstats, gpu, training], errors, args.interval,
                      state=StateStore(tmp / "state"), publish=ExpositionHolder().show)
    for _ in range(args.warmup):  # look-ups, first GPU reads, held files opened
        sampler.sample_once()
        time.sleep(args.interval)
    profile = cProfile.Profile(time.thread_time)  # CPU, not wall: a wait is not cost
    thread_ms, process_ms, steps = [], [], {}
    for _ in range(args.samples):
        t0, p0 = time.thread_time(), time.process_time()
        if args.profile:
            profile.enable()
        snapshot = sampler.sample_once()
        if args.profile:
            profile.disable()
        thread_ms.append((time.thread_time() - t0) * 1000)
        process_ms.append((time.process_time() - p0) * 1000)
        for step in snapshot.steps:
            steps.setdefault(step.name, []).append(step.duration_seconds * 1000)
        time.sleep(args.interval)
    training.stop()
    gpu.close()
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out) if args.profile else None
    figures = {
        "jobs": len(snapshot.jobs),
        "gpus": len(snapshot.gpus),
        "samples": args.samples,
        "sampler_thread_cpu_ms_p50": round(percentile(thread_ms, 50), 2),
        "sampler_thread_cpu_ms_min_max": [round(min(thread_ms), 2), round(max(thread_ms), 2)],
        "process_cpu_ms_p50": round(percentile(process_ms, 50), 2),
        "step_wall_ms_p50": {k: round(percentile(v, 50), 3) for k, v in steps.items()},
    }
    if args.profile:
        figures["top_own_time"] = _top(stats, "tottime", out)
        figures["top_inclusive"] = _top(stats, "cumulative", out)
    print(json.dumps(figures))


def _top(stats: pstats.Stats | None, key: str, out: io.StringIO) -> list[str]:
    assert stats is not None
    out.seek(0)
    out.truncate()
    stats.sort_stats(key).print_stats(TOP)
    lines = out.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
    return [" ".join(line.split()) for line in lines[start + 1:] if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cgroup-root", default="/sys/fs/cgroup")
    parser.add_argument("--spool-dir", default="/var/tmp/sge-testcluster/spool")
    parser.add_argument("--node-name", default="",
                        help="ask Slurm (the CLI) about jobs as this node; none when empty")
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=12)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--no-profile", dest="profile", action="store_false",
                        help="time the samples without cProfile (whose hooks inflate them)")
    parser.add_argument("--idle-samples", action="store_true",
                        help="idle GPUs keep taking a sample every period (the fake's "
                             "idle_samples; default: an idle GPU's buffer answers NOT_FOUND)")
    parser.add_argument("--tag", default="")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sge-bench-") as tmp:
        if args.child:
            child(args, Path(tmp))
            return
        from tests.fakenvml import Device, FakeNvml, NvmlState

        fake = FakeNvml(Path(tmp) / "nvml")
        fake.write(NvmlState(devices=[Device(i) for i in range(args.gpus)],
                             idle_samples=args.idle_samples))
        at_start = yardstick()
        out = subprocess.run([sys.executable, __file__, "--child", *sys.argv[1:]],
                             env=fake.env(), capture_output=True, text=True, check=False)
        if out.returncode != 0:
            sys.exit(out.stderr[-4000:])
        figures = json.loads(out.stdout.strip().splitlines()[-1])
    record("cycle_profile" + (f"_{args.tag}" if args.tag else ""),
           {"command": "python bench/cycle_profile.py " + " ".join(sys.argv[1:]),
            "yardstick_before_child": at_start, **figures})


if __name__ == "__main__":
    main()
