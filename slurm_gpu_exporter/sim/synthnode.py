"""A synthetic Slurm node on disk, for running the real agent over it (``--simulate``
and the tests).

Writes what the agent reads through ``--cgroup-root``, ``--proc-root`` and
``--spool-dir``: a cgroup v1 tree laid out as Debian's Slurm 22.05 makes it
(``<ctrl>/slurm_<node>/uid_<uid>/job_<id>/step_0/task_0``, controllers memory,
freezer, cpuacct and cpuset; see tests/fixtures/slurm-22.05), a /proc tree
holding only the PIDs a test chooses (``stat`` with a start time, ``cgroup``
lines pointing at the job's cgroup, ``status`` with the Uid), and spool records
written with :mod:`slurm_gpu_exporter.hooks.spool` as the prolog would. A process
outside every job sits in a systemd user slice.

The tests pair it with the fake NVML (tests/fakenvml), whose processes use the
same PIDs; ``--simulate`` (sim/simulate.py) keeps its files moving.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from slurm_gpu_exporter.hooks import spool

CONTROLLERS = ("memory", "freezer", "cpuacct", "cpuset")
GIB = 1024**3


def _write(path: Path, text: str) -> None:
    """Atomic: the agent never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@dataclass
class SynthJob:
    jobid: int
    uid: int
    user: str
    pids: list[int]
    job_gpus: str = ""
    cuda_visible_devices: str = ""
    start_time: float = 0.0
    cpus: list[int] = field(default_factory=lambda: [0, 1])
    cpu_ns: int = 0
    memory_bytes: int = GIB
    memory_limit: int = 8 * GIB
    end_time: float | None = None
    account: str = "acct"
    step: str = "0"  # the step whose task_0 holds the processes ("batch" for sbatch)
    peak_bytes: int = 0


class SynthNode:
    """One node under ``base``: ``cgroup/``, ``proc/``, ``spool/`` and ``state/``."""

    def __init__(self, base: Path, node: str = "node1",
                 start_ticks: Callable[[int], int] = lambda pid: 10_000 + pid) -> None:
        """``start_ticks``: a process's start time in clock ticks after boot, by PID."""
        self.base = Path(base)
        self.node = node
        self._start_ticks = start_ticks
        self.cgroup_root = self.base / "cgroup"
        self.proc_root = self.base / "proc"
        self.spool_dir = self.base / "spool"
        self.state_dir = self.base / "state"
        self.jobs: dict[int, SynthJob] = {}
        for ctrl in CONTROLLERS:
            top = self.cgroup_root / ctrl / f"slurm_{node}"
            top.mkdir(parents=True, exist_ok=True)
            _write(top / "cgroup.procs", "")
            _write(self.cgroup_root / ctrl / "cgroup.procs", "")
        self.proc_root.mkdir(parents=True, exist_ok=True)
        os.close(spool.open_spool_dir(str(self.spool_dir), create=True))

    def agent_args(self, sample_interval: float = 1.0, *extra: str) -> list[str]:
        """The agent's flags for this node (no Slurm look-ups: there is no Slurm here)."""
        return [
            "--cgroup-root", str(self.cgroup_root), "--proc-root", str(self.proc_root),
            "--spool-dir", str(self.spool_dir), "--state-dir", str(self.state_dir),
            "--sample-interval", str(sample_interval), "--slurm-lookup", "off", *extra,
        ]  # fmt: skip

    # -- jobs ---------------------------------------------------------------

    def job_dir(self, ctrl: str, job: SynthJob) -> Path:
        return (self.cgroup_root / ctrl / f"slurm_{self.node}" / f"uid_{job.uid}"
                / f"job_{job.jobid}")  # fmt: skip

    def add_job(
        self,
        jobid: int,
        pids: list[int],
        *,
        uid: int = 1001,
        user: str = "sgeuser",
        job_gpus: str = "",
        cuda_visible_devices: str | None = None,
        start_time: float | None = None,
        record: bool = True,
        comm: str = "python",
        account: str = "acct",
        cpus: list[int] | None = None,
        memory_limit: int = 8 * GIB,
        step: str = "0",
        environ: bool = False,
    ) -> SynthJob:
        """A running job: its cgroups, its processes in /proc, and its prolog record.

        ``job_gpus`` is SLURM_JOB_GPUS (Slurm indices = device minors);
        ``cuda_visible_devices`` defaults to the same, as slurmd gives it. With
        ``environ`` its processes carry SLURM_JOB_ID in their environment.
        """
        job = SynthJob(
            jobid=jobid, uid=uid, user=user, pids=list(pids), job_gpus=job_gpus,
            cuda_visible_devices=job_gpus if cuda_visible_devices is None
            else cuda_visible_devices,
            start_time=time.time() if start_time is None else start_time,
            account=account, cpus=[0, 1] if cpus is None else list(cpus),
            memory_limit=memory_limit, step=step,
        )  # fmt: skip
        self.jobs[jobid] = job
        for ctrl in CONTROLLERS:
            job_dir = self.job_dir(ctrl, job)
            task = job_dir / f"step_{step}" / "task_0"
            task.mkdir(parents=True, exist_ok=True)
            # slurmstepd sits above the leaves; only the tasks are in task_0.
            _write(job_dir / "cgroup.procs", "")
            _write(job_dir / f"step_{step}" / "cgroup.procs", "")
            _write(task / "cgroup.procs", "".join(f"{p}\n" for p in job.pids))
        cpuset = self.job_dir("cpuset", job)
        cpus = ",".join(map(str, job.cpus)) + "\n"
        _write(cpuset / "cpuset.cpus", cpus)
        _write(cpuset / "cpuset.effective_cpus", cpus)
        _write(cpuset / "cpuset.mems", "0\n")
        self.update_job(jobid)
        for pid in job.pids:
            self.add_process(pid, uid, cgroup_path=self.task_cgroup(job), comm=comm,
                             environ={"SLURM_JOB_ID": str(jobid)} if environ else None)
        if record:
            self.write_record(job)
        return job

    def task_cgroup(self, job: SynthJob) -> str:
        """The cgroup path (as /proc/<pid>/cgroup shows it) of the job's processes."""
        return f"/slurm_{self.node}/uid_{job.uid}/job_{job.jobid}/step_{job.step}/task_0"

    def update_job(self, jobid: int, *, cpu_seconds: float | None = None,
                   memory_bytes: int | None = None, cache_bytes: int | None = None) -> None:
        """Rewrite the job's CPU and memory accounting (as time passes).

        The page cache is a tenth of the resident memory unless given; the peak is
        the highest usage written so far.
        """
        job = self.jobs[jobid]
        if cpu_seconds is not None:
            job.cpu_ns = int(cpu_seconds * 1e9)
        if memory_bytes is not None:
            job.memory_bytes = memory_bytes
        _write(self.job_dir("cpuacct", job) / "cpuacct.usage", f"{job.cpu_ns}\n")
        memory = self.job_dir("memory", job)
        cache = job.memory_bytes // 10 if cache_bytes is None else cache_bytes
        job.peak_bytes = max(job.peak_bytes, job.memory_bytes + cache)
        _write(memory / "memory.usage_in_bytes", f"{job.memory_bytes + cache}\n")
        _write(memory / "memory.max_usage_in_bytes", f"{job.peak_bytes}\n")
        _write(memory / "memory.limit_in_bytes", f"{job.memory_limit}\n")
        _write(memory / "memory.stat", f"total_rss {job.memory_bytes}\ntotal_cache {cache}\n"
                                       f"total_inactive_file {cache}\n")
        _write(memory / "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")

    def remove_job(self, jobid: int) -> None:
        """The job is gone: its cgroups and its processes (not its spool record)."""
        job = self.jobs.pop(jobid)
        for ctrl in CONTROLLERS:
            shutil.rmtree(self.job_dir(ctrl, job), ignore_errors=True)
        for pid in job.pids:
            shutil.rmtree(self.proc_root / str(pid), ignore_errors=True)

    def write_record(self, job: SynthJob) -> None:
        """The prolog's spool record (the epilog's, once the job has an end time)."""
        rec = spool.JobRecord(
            jobid=str(job.jobid), uid=job.uid, user=job.user, account=job.account,
            partition="gpu", cluster="synth", node=self.node, job_gpus=job.job_gpus,
            cuda_visible_devices=job.cuda_visible_devices,
            gpu_device_ordinal=job.cuda_visible_devices, start_time=job.start_time,
            end_time=job.end_time,
        )  # fmt: skip
        fd = spool.open_spool_dir(str(self.spool_dir), create=True)
        try:
            spool.write_record(fd, rec)
        finally:
            os.close(fd)

    # -- processes ----------------------------------------------------------

    def add_process(self, pid: int, uid: int, *, cgroup_path: str | None = None,
                    comm: str = "python", start_ticks: int | None = None,
                    environ: dict[str, str] | None = None) -> None:
        """A process in /proc. Without ``cgroup_path`` it sits in the user's login
        session (``/user.slice/user-<uid>.slice/session-1.scope``): in no Slurm job."""
        path = cgroup_path or f"/user.slice/user-{uid}.slice/session-1.scope"
        d = self.proc_root / str(pid)
        self.set_cpu_ticks(pid, 100, comm=comm, start_ticks=start_ticks)
        _write(d / "status", f"Name:\t{comm}\nState:\tS (sleeping)\nPid:\t{pid}\nPPid:\t1\n"
                             f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        # Debian 12 with cgroup v1 (as the fixtures): one line per hierarchy.
        systemd = path if cgroup_path is None else "/system.slice/slurmd.service"
        lines = ["9:name=systemd:" + systemd, "8:pids:/", "7:blkio:/"]
        if cgroup_path is None:
            lines += ["6:freezer:/", "5:devices:/", "4:memory:" + path, "3:cpuset:/",
                      "2:cpuacct:/"]
        else:
            lines += [f"6:freezer:{path}", f"5:devices:{path}", f"4:memory:{path}",
                      f"3:cpuset:{path}", f"2:cpuacct:{path}"]
        _write(d / "cgroup", "\n".join([*lines, "1:cpu:/", "0::/"]) + "\n")
        _write(d / "cmdline", f"{comm}\0")
        env = {"HOME": "/tmp", **(environ or {})}
        _write(d / "environ", "".join(f"{k}={v}\0" for k, v in env.items()))

    def set_cpu_ticks(self, pid: int, utime: int, *, comm: str = "python",
                      start_ticks: int | None = None) -> None:
        """Rewrite a process's stat with ``utime`` user ticks (system: a tenth of it)."""
        start = self._start_ticks(pid) if start_ticks is None else start_ticks
        # Fields 3.. of proc(5): state ppid pgrp session tty tpgid flags minflt cminflt
        # majflt cmajflt utime stime cutime cstime priority nice threads itreal starttime
        fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194304", "0", "0", "0", "0",
                  str(utime), str(utime // 10), "0", "0", "20", "0", "1", "0",
                  str(start)] + ["0"] * 30
        _write(self.proc_root / str(pid) / "stat", f"{pid} ({comm}) {' '.join(fields)}\n")
