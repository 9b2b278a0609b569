"""``--simulate``: a synthetic Slurm GPU node, for demos and dashboards.

The node lives in a temporary directory as the files the real agent reads,
written by synthnode.py (as for the tests): a cgroup v1 tree laid out as Slurm
makes it, a /proc tree of the jobs' processes; its spool records are written by
the real prolog/epilog code. The agent
then runs unchanged over it (``--cgroup-root``, ``--proc-root``, ``--spool-dir``),
so the demo exercises the same code paths as a real node.

Jobs of several users come and go: busy ones, bursty ones, idle ones holding
GPUs they never use, and one found only through its cgroup (as if the agent
had started after it).
"""

from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from slurm_gpu_exporter.hooks.jobhooks import run_epilog, run_prolog
from slurm_gpu_exporter.node.slurm.lookup import SlurmJobInfo
from slurm_gpu_exporter.sim.meter import SimulatedMeter
from slurm_gpu_exporter.sim.rapl import SimulatedRapl
from slurm_gpu_exporter.sim.synthnode import SynthNode

NODE = "simnode"
CPUS = 64
GPUS = 8
USERS = {"alice": 2001, "bob": 2002, "carol": 2003, "dave": 2004, "erin": 2005}
ACCOUNTS = {"alice": "physics", "bob": "chem", "carol": "ml", "dave": "ml", "erin": "bio"}
TICK_S = 1.0


@dataclass(frozen=True)
class Profile:
    """How a job uses what it holds."""

    name: str
    cpu_cores: float  # busy cores
    memory_gib: float  # resident memory around which usage wanders
    gpus: int
    # GPU busy percent at time t (s since job start) for the job's n-th GPU
    period_s: float = 30.0
    busy_s: float = 30.0
    busy_percent: float = 95.0
    gpus_used: int = 99  # how many of its GPUs the job actually runs on
    gpu_memory_gib: float = 20.0

    def gpu_percent(self, t: float, n: int) -> float:
        if n >= self.gpus_used:
            return 0.0
        return self.busy_percent if (t % self.period_s) < self.busy_s else 0.0


PROFILES = (
    Profile("busy", cpu_cores=3.5, memory_gib=24, gpus=2, busy_percent=92),
    Profile("bursty", cpu_cores=1.2, memory_gib=12, gpus=1, period_s=30, busy_s=3,
            busy_percent=100),
    Profile("idle", cpu_cores=0.05, memory_gib=2, gpus=1, busy_percent=0, gpus_used=0,
            gpu_memory_gib=1.5),
    Profile("half-idle", cpu_cores=2.0, memory_gib=16, gpus=2, busy_percent=80, gpus_used=1),
)


@dataclass
class SimJob:
    jobid: int
    user: str
    profile: Profile
    gpus: list[int]
    cpus: list[int]
    start: float
    duration: float
    pids: list[int]
    recorded: bool = True  # False: found through its cgroup only
    cpu_ns: float = 0.0
    utime_ticks: list[int] = field(default_factory=list)

    @property
    def uid(self) -> int:
        return USERS[self.user]

    @property
    def memory_limit(self) -> int:
        return len(self.cpus) * 4 * 2**30


@dataclass(frozen=True)
class SimGpuProcess:
    """A process on a simulated GPU, with its job's usage at a given time."""

    gpu: int
    pid: int
    used_memory: int
    sm_percent: float


class SimulatedNode:
    """Keeps a synthetic node's files moving in a background thread."""

    def __init__(self, base: Path, seed: int = 7) -> None:
        self.base = base
        self.files = SynthNode(base, node=NODE, start_ticks=_start_ticks)
        self.cgroup_root = self.files.cgroup_root
        self.proc_root = self.files.proc_root
        self.spool_dir = self.files.spool_dir
        self.state_dir = self.files.state_dir
        self.gpu_count = GPUS
        self.powercap_root = base / "powercap"
        self.rapl = SimulatedRapl(self.powercap_root, self.proc_root, CPUS)
        self.hwmon_root = base / "hwmon"
        self.meter = SimulatedMeter(self.hwmon_root, GPUS)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._jobs: dict[int, SimJob] = {}
        self._next_jobid = 4100
        self._next_pid = 41_000
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # A user's process on the last GPU outside every job (logged in with ssh).
        self.stray_pid = self._new_pid()
        self.files.add_process(self.stray_pid, USERS["erin"])
        self.files.set_cpu_ticks(self.stray_pid, 500)
        now = time.time()
        self._born = now  # the stray process is there for the first 10 minutes
        # Start with a full node of jobs of different ages and kinds.
        for i, profile in enumerate(PROFILES):
            self._start_job(now, profile, age=600.0 + 900.0 * i, recorded=profile.name != "bursty")

    # -- public -------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="simulated-node", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def slurm_lookup(self, jobid: str) -> SlurmJobInfo | None:
        """The simulated controller: metadata of jobs the prolog did not record."""
        with self._lock:
            job = self._jobs.get(int(jobid)) if jobid.isdigit() else None
        if job is None:
            return None
        return SlurmJobInfo(
            jobid=jobid, uid=job.uid, user=job.user, account=ACCOUNTS[job.user],
            partition="gpu", name=f"{job.profile.name}-train", state="RUNNING",
            job_gpus=",".join(map(str, job.gpus)), start_time=job.start,
        )

    def gpu_processes(self, now: float) -> list[SimGpuProcess]:
        """Every process on a simulated GPU right now, jobs' and the stray one."""
        procs = []
        with self._lock:
            for job in self._jobs.values():
                t = now - job.start
                for n, (gpu, pid) in enumerate(zip(job.gpus, job.pids, strict=False)):
                    if n >= job.profile.gpus_used and job.profile.gpus_used > 0:
                        continue  # half-idle: no process at all on the GPU it ignores
                    wobble = 1 + 0.1 * math.sin(t / 50 + n)
                    procs.append(SimGpuProcess(
                        gpu=gpu, pid=pid,
                        used_memory=int(job.profile.gpu_memory_gib * 2**30 * wobble),
                        sm_percent=job.profile.gpu_percent(t, n),
                    ))
        if int((now - self._born) / 600) % 2 == 0:  # the stray process comes and goes
            procs.append(SimGpuProcess(gpu=GPUS - 1, pid=self.stray_pid, used_memory=3 * 2**30,
                                       sm_percent=35.0))
        return procs

    # -- the node's life ----------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            now = time.time()
            with self._lock:
                for job in list(self._jobs.values()):
                    if now - job.start >= job.duration:
                        self._end_job(now, job)
                    else:
                        self._advance(job, now)
                self._fill_node(now)
                # the jobs' cores and a little system time outside them
                busy = sum(job.profile.cpu_cores for job in self._jobs.values()) + 0.5
                self.meter.set(self.rapl.advance(TICK_S, busy))

    def _free_gpus(self) -> list[int]:
        used = {g for job in self._jobs.values() for g in job.gpus}
        return [g for g in range(GPUS) if g not in used]

    def _fill_node(self, now: float) -> None:
        free = self._free_gpus()
        candidates = [p for p in PROFILES if p.gpus <= len(free)]
        if candidates and len(self._jobs) < 6:
            self._start_job(now, self._rng.choice(candidates), age=0.0, recorded=True)

    def _start_job(self, now: float, profile: Profile, age: float, recorded: bool) -> None:
        free = self._free_gpus()
        if len(free) < profile.gpus:
            return
        jobid = self._next_jobid
        self._next_jobid += 1
        user = list(USERS)[jobid % len(USERS)]
        used_cpus = {c for job in self._jobs.values() for c in job.cpus}
        cpus = [c for c in range(CPUS) if c not in used_cpus][: 4 * profile.gpus]
        job = SimJob(
            jobid=jobid, user=user, profile=profile, gpus=free[: profile.gpus], cpus=cpus,
            start=now - age, duration=age + self._rng.uniform(600, 1800),
            pids=[self._new_pid() for _ in range(profile.gpus)], recorded=recorded,
        )
        job.cpu_ns = profile.cpu_cores * age * 1e9
        job.utime_ticks = [int(profile.cpu_cores * age * 100 / len(job.pids))] * len(job.pids)
        self._jobs[jobid] = job
        self.files.add_job(
            jobid, job.pids, uid=job.uid, user=user, job_gpus=",".join(map(str, job.gpus)),
            start_time=job.start, record=False, comm=f"{profile.name}-train",
            account=ACCOUNTS[user], cpus=cpus, memory_limit=job.memory_limit, step="batch",
            environ=True)
        if recorded:
            run_prolog(self._slurm_env(job), str(self.spool_dir), job.start)
        self._advance(job, now)

    def _advance(self, job: SimJob, now: float) -> None:
        t = now - job.start
        job.cpu_ns += job.profile.cpu_cores * TICK_S * 1e9 * self._rng.uniform(0.8, 1.2)
        wave = 1 + 0.15 * math.sin(t / 40) + self._rng.uniform(-0.02, 0.02)
        rss = int(job.profile.memory_gib * 2**30 * wave)
        self.files.update_job(job.jobid, cpu_seconds=job.cpu_ns / 1e9, memory_bytes=rss,
                              cache_bytes=int(rss * 0.2))
        for i, pid in enumerate(job.pids):
            job.utime_ticks[i] += int(job.profile.cpu_cores * TICK_S * 100 / len(job.pids))
            self.files.set_cpu_ticks(pid, job.utime_ticks[i], comm=f"{job.profile.name}-train")

    def _end_job(self, now: float, job: SimJob) -> None:
        del self._jobs[job.jobid]
        if job.recorded:
            run_epilog(self._slurm_env(job), str(self.spool_dir), now)
        self.files.remove_job(job.jobid)

    # -- files --------------------------------------------------------------

    def _new_pid(self) -> int:
        self._next_pid += self._rng.randint(1, 40)
        return self._next_pid

    def _slurm_env(self, job: SimJob) -> dict[str, str]:
        gpus = ",".join(map(str, job.gpus))
        return {
            "SLURM_JOB_ID": str(job.jobid), "SLURM_JOB_UID": str(job.uid),
            "SLURM_JOB_USER": job.user, "SLURM_JOB_ACCOUNT": ACCOUNTS[job.user],
            "SLURM_JOB_PARTITION": "gpu", "SLURM_CLUSTER_NAME": "sim",
            "SLURMD_NODENAME": NODE, "SLURM_JOB_GPUS": gpus, "CUDA_VISIBLE_DEVICES": gpus,
        }


def _start_ticks(pid: int) -> int:
    """Each process's start time in clock ticks after boot: distinct, as on a real node."""
    return 100 * (pid - 40_000)
