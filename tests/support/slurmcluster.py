"""Drive the real one-node Slurm test cluster (scripts/slurm-testcluster) from tests.

The cluster runs one Slurm release at a time (``SlurmCluster(release=...)``): the host's
own (Debian 12's 22.05) or 24.11, 25.11 or 26.05 from a Debian 13 root, whose client
commands come first on ``env``'s PATH. Each uses cgroup v1: every job gets directories
``/sys/fs/cgroup/<controller>/<slurm root>/uid_<uid>/job_<id>/step_<s>[/task_<n>]`` in
cpuset, memory, devices, freezer, and (only with ``jobacct_gather/cgroup``) cpuacct; the
slurm root is ``slurm_<node>`` for Debian's packages (built with multiple-slurmd) and
``slurm`` for a release built from its source.
freezer holds every process of a step directly in the step directory (no task
directories), so it is the one place to list a job's processes. The extern step's
``sleep`` runs as root; the batch and srun steps run as the job's user.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support import REPO

SCRIPT = REPO / "scripts" / "slurm-testcluster"
CGROUP_ROOT = Path("/sys/fs/cgroup")
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
REQUIRED_BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "munged",
                     "slurmdbd", "sacct", "sacctmgr", "mariadbd")
# The accounts `up` makes with sacctmgr: user -> (default account, other accounts).
ACCOUNTS = {"sgeuser": ("physics", ("chemistry",)), "sgeuser2": ("chemistry", ())}
SACCT_FIELDS = ("JobIDRaw", "State", "ExitCode", "Account", "User", "Timelimit", "ReqMem",
                "AllocCPUS", "Start", "End")
# Job states after which a job runs no more processes.
FINISHED_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
    }
)


class SlurmError(RuntimeError):
    """A Slurm command failed or the cluster did not do what was asked in time."""


# PrologFlags unless a test asks for RunInJob (24.05+: the prolog runs in the extern step).
DEFAULT_PROLOG_FLAGS = "Alloc,Contain"
RUN_IN_JOB = "Alloc,Contain,RunInJob"
# The releases the cluster can run; the host's own runs from its packages.
RELEASES = ("22.05", "24.11", "25.11", "26.05")
# Where the project is installed in a release's root (the Ansible role's prefix).
SITE_BIN = Path("/opt/slurm-gpu-exporter/bin")
# What a release in a Debian 13 root needs of the host besides its own Slurm.
ROOT_BINARIES = ("munged", "mariadbd", "mmdebstrap", "unshare", "chroot")


def _which(name: str, path: str = SBIN_PATH) -> str | None:
    return shutil.which(name, path=path)


def host_release() -> str | None:
    """The host's own Slurm release (major.minor, as slurmctld -V says), or None."""
    slurmctld = _which("slurmctld")
    if slurmctld is None:
        return None
    out = subprocess.run([slurmctld, "-V"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"(\d+)\.(\d+)", out)
    return f"{int(m.group(1))}.{int(m.group(2)):02d}" if m else None


def unavailable_reason(release: str | None = None) -> str | None:
    """Why the real cluster (of ``release``; the host's own by default) cannot run here,
    or None when it can."""
    native = host_release()
    if release is None or release == native:
        missing = [b for b in REQUIRED_BINARIES if _which(b) is None]
        if missing:
            return (f"missing {', '.join(missing)}"
                    " (apt-get install slurm-wlm slurmdbd mariadb-server munge)")
    else:
        missing = [b for b in ROOT_BINARIES if _which(b) is None]
        if missing:
            return (f"Slurm {release} runs from a Debian 13 root: missing {', '.join(missing)}"
                    " (apt-get install munge mariadb-server mmdebstrap)")
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (it starts slurmctld, slurmd and munged)"
    if not (CGROUP_ROOT / "freezer" / "cgroup.procs").exists():
        return f"cgroup v1 controllers are not mounted under {CGROUP_ROOT} (need cgroup/v1)"
    return None


class SlurmCluster:
    """The one-node cluster ``sgetest``: start/stop it, submit jobs, look at their cgroups."""

    def __init__(self, state_dir: Path | None = None, jobacct: str | None = None,
                 release: str | None = None) -> None:
        """Describe the cluster; nothing starts before :meth:`up`.

        ``state_dir`` defaults to $SGE_TESTCLUSTER_DIR or /var/tmp/sge-testcluster (with
        ``-RELEASE`` for a release other than the host's); ``jobacct`` ("cgroup" or
        "none") defaults to $SGE_JOBACCT or "cgroup"; ``release`` to $SGE_SLURM_RELEASE
        or the host's own.
        """
        self._env_overrides: dict[str, str] = {}
        if state_dir is not None:
            self._env_overrides["SGE_TESTCLUSTER_DIR"] = str(state_dir)
        release = release or os.environ.get("SGE_SLURM_RELEASE") or None
        if release is not None:
            self._env_overrides["SGE_SLURM_RELEASE"] = release
        self.jobacct = jobacct or os.environ.get("SGE_JOBACCT", "cgroup")
        self.prolog_flags = DEFAULT_PROLOG_FLAGS
        exports = self._parse_exports(self._script("env").stdout)
        self.release = exports["SGE_SLURM_RELEASE"]
        # A root's client commands, first on PATH; "" for the host's own release.
        self.bin_dir = exports.get("SGE_SLURM_BIN", "")
        self.path = f"{self.bin_dir}:{SBIN_PATH}" if self.bin_dir else SBIN_PATH
        self.state_dir = Path(exports["SGE_TESTCLUSTER_STATE"])
        self.slurm_conf = Path(exports["SLURM_CONF"])
        self.node_name = exports["SGE_NODE_NAME"]
        self.cluster_name = exports["SGE_CLUSTER_NAME"]
        self.spool_dir = Path(exports["SLURM_GPU_EXPORTER_SPOOL_DIR"])
        # Where the cluster's prolog/epilog helpers read the spool they write to.
        self.hook_spool_file = Path(exports["SGE_HOOK_SPOOL_FILE"])
        # slurmctld's MailProg runs this program when it exists (a test's own).
        self.mail_hook = Path(exports["SGE_MAIL_HOOK"])
        self.jobs_dir = self.state_dir / "jobs"
        self.log_dir = self.state_dir / "log"
        self.cgroup_root = CGROUP_ROOT

    # -- the cluster ------------------------------------------------------------------

    def _script(self, command: str, check: bool = True, args: Sequence[str] = ()
                ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **self._env_overrides, "SGE_JOBACCT": self.jobacct,
               "SGE_PROLOG_FLAGS": self.prolog_flags}
        proc = subprocess.run(
            ["bash", str(SCRIPT), command, *args], env=env, capture_output=True, text=True,
            check=False, timeout=1800,  # a first `up` of a built release may build it
        )
        if check and proc.returncode != 0:
            raise SlurmError(
                f"slurm-testcluster {command} failed ({proc.returncode}):\n"
                f"{proc.stdout}{proc.stderr}"
            )
        return proc

    @staticmethod
    def _parse_exports(text: str) -> dict[str, str]:
        exports: dict[str, str] = {}
        for line in text.splitlines():
            m = re.match(r"export (\w+)=(.*)$", line.strip())
            if m:
                value = shlex.split(m.group(2))
                exports[m.group(1)] = value[0] if value else ""
        return exports

    def up(self, jobacct: str | None = None, prolog_flags: str | None = None) -> str:
        """Start the cluster (idempotent; a changed ``jobacct`` or ``prolog_flags``
        restarts the daemons)."""
        if jobacct is not None:
            self.jobacct = jobacct
        if prolog_flags is not None:
            self.prolog_flags = prolog_flags
        return self._script("up").stdout

    def down(self) -> str:
        """Cancel all jobs and stop what ``up`` started."""
        return self._script("down").stdout

    def site_command(self, name: str) -> list[str]:
        """How to run the console script ``name`` as this release's node runs it: this
        checkout's venv on the host's release; in a root, the project installed there
        from its wheel (/opt/slurm-gpu-exporter), chrooted with the caller's environment
        but PATH, under the same pid (stop it by that pid)."""
        if not self.in_root:
            return [str(Path(sys.executable).parent / name)]
        return ["bash", str(SCRIPT), "--slurm", self.release, "exec", str(self.site_bin / name)]

    @property
    def site_bin(self) -> Path:
        """Where the node's Slurm (its MailProg, say) finds the project's console scripts."""
        return SITE_BIN if self.in_root else Path(sys.executable).parent

    def run_as_site(self, argv: Sequence[str]) -> str:
        """Run ``argv`` as root where this release's daemons run (its Debian 13 root,
        for a release other than the host's): a site's command line on that release.
        Returns stdout; SlurmError when it fails."""
        return self._script("exec", args=argv).stdout

    def is_up(self) -> bool:
        """True when slurmctld, slurmd and munged all run."""
        return self._script("status", check=False).returncode == 0

    @property
    def env(self) -> dict[str, str]:
        """A minimal environment for Slurm client commands."""
        return {"PATH": self.path, "SLURM_CONF": str(self.slurm_conf), "LANG": "C.UTF-8"}

    @property
    def node_path(self) -> str:
        """PATH for what runs where the daemons run (MailProg, the prolog): the release's
        own commands first (a built release keeps them under its prefix in the root)."""
        prefix = (self.state_dir / "prefix").read_text().strip() if self.in_root else "/usr"
        return f"{prefix}/bin:/usr/bin:/bin" if prefix != "/usr" else "/usr/bin:/bin"

    @property
    def user_path(self) -> str:
        """A user's plain PATH on this release's node: its client commands first."""
        return f"{self.bin_dir}:/usr/bin:/bin" if self.bin_dir else "/usr/bin:/bin"

    @property
    def in_root(self) -> bool:
        """Whether this release runs from a Debian 13 root (not the host's packages)."""
        return bool(self.bin_dir)

    @property
    def version(self) -> tuple[int, int]:
        """(major, minor) of the release."""
        major, minor = self.release.split(".")
        return int(major), int(minor)

    def run(self, argv: Sequence[str], check: bool = True, input: str | None = None) -> str:
        """Run a Slurm client command as root; return its stdout."""
        proc = subprocess.run(
            list(argv), env=self.env, input=input, capture_output=True, text=True, check=False
        )
        if check and proc.returncode != 0:
            raise SlurmError(f"{shlex.join(argv)} failed ({proc.returncode}): {proc.stderr}")
        return proc.stdout

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of slurmctld's and slurmd's logs (for failure messages)."""
        parts = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.log_dir / name
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path} ---\n" + "\n".join(tail))
        return "\n".join(parts)

    def node_state(self) -> str:
        """The node's state as sinfo says it (idle, mixed, allocated, drained, ...)."""
        return self.run(["sinfo", "-h", "-n", self.node_name, "-o", "%T"]).strip()

    # -- users ------------------------------------------------------------------------

    @staticmethod
    def uid(user: str) -> int:
        """The numeric uid of ``user``."""
        return pwd.getpwnam(user).pw_uid

    # -- jobs -------------------------------------------------------------------------

    def submit(
        self,
        script_text: str,
        user: str = "sgeuser",
        gres: str | None = "gpu:2",
        extra_args: Iterable[str] = (),
    ) -> int:
        """Submit a batch script as ``user`` (really as that user: runuser + sbatch).

        Output goes to ``jobs_dir/<jobid>.out``. For ``--array`` the array's job id is
        returned; the tasks' own job ids come from :meth:`array_task_job_ids`.
        """
        if not script_text.startswith("#!"):
            script_text = "#!/bin/sh\n" + script_text
        home = pwd.getpwnam(user).pw_dir
        argv = [
            _which("runuser") or "/usr/sbin/runuser",
            "-u",
            user,
            "--",
            _which("sbatch", self.path) or "sbatch",
            "--parsable",
            f"--chdir={self.jobs_dir}",
            f"--output={self.jobs_dir}/%j.out",
        ]
        if gres:
            argv.append(f"--gres={gres}")
        argv.extend(extra_args)
        env = {
            "PATH": f"{self.bin_dir}:/usr/local/bin:/usr/bin:/bin" if self.bin_dir
            else "/usr/local/bin:/usr/bin:/bin",
            "SLURM_CONF": str(self.slurm_conf),
            "HOME": home,
            "USER": user,
            "LOGNAME": user,
            "LANG": "C.UTF-8",
        }
        proc = subprocess.run(
            argv,
            env=env,
            input=script_text,
            capture_output=True,
            text=True,
            check=False,
            cwd="/",
        )
        if proc.returncode != 0:
            raise SlurmError(f"sbatch as {user} failed ({proc.returncode}): {proc.stderr.strip()}")
        return int(proc.stdout.strip().split(";")[0])

    def allocate(self, user: str = "sgeuser", gres: str = "gpu:1") -> int:
        """An interactive allocation as ``user`` (``salloc --no-shell``: no batch script,
        as a user's salloc session holds it); its job id."""
        argv = [_which("runuser") or "/usr/sbin/runuser", "-u", user, "--",
                _which("salloc", self.path) or "salloc", "--no-shell", f"--gres={gres}"]
        env = {"PATH": self.user_path, "SLURM_CONF": str(self.slurm_conf), "LANG": "C.UTF-8",
               "HOME": pwd.getpwnam(user).pw_dir, "USER": user}
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False,
                              cwd="/", timeout=60)
        m = re.search(r"Granted job allocation (\d+)", proc.stderr)
        if proc.returncode != 0 or m is None:
            raise SlurmError(f"salloc as {user} failed ({proc.returncode}): {proc.stderr.strip()}")
        return int(m.group(1))

    def job_info(self, jobid: int) -> list[dict[str, str]]:
        """``scontrol -o show job`` as dicts (several records for an array); [] if unknown."""
        proc = subprocess.run(
            ["scontrol", "-o", "show", "job", str(jobid)],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr:
                return []
            raise SlurmError(f"scontrol show job {jobid} failed: {proc.stderr.strip()}")
        records = []
        for line in proc.stdout.splitlines():
            record: dict[str, str] = {}
            # Values never hold spaces except in a few fields we do not need.
            for token in line.split():
                key, sep, value = token.partition("=")
                if sep and key not in record:
                    record[key] = value
            if record:
                records.append(record)
        return records

    def _record(self, jobid: int) -> dict[str, str] | None:
        for record in self.job_info(jobid):
            if record.get("JobId") == str(jobid):
                return record
        return None

    def state(self, jobid: int) -> str | None:
        """The job's state (RUNNING, COMPLETED, ...), or None once Slurm forgot the job."""
        record = self._record(jobid)
        return record["JobState"] if record else None

    def wait_state(self, jobid: int, states: Collection[str] | str, timeout: float = 30.0) -> str:
        """Wait until the job is in one of ``states``; return it.

        Raises SlurmError when it reaches another finished state or on timeout.
        """
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        last: str | None = None
        while True:
            last = self.state(jobid)
            if last in wanted:
                return last
            if last in FINISHED_STATES:
                raise SlurmError(f"job {jobid} ended {last}, not {sorted(wanted)}")
            if time.monotonic() > deadline:
                record = self._record(jobid) or {}
                raise SlurmError(
                    f"job {jobid} is {last} (reason {record.get('Reason')}) after {timeout}s,"
                    f" not {sorted(wanted)}; node {self.node_state()}\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def wait_finished(self, jobid: int, timeout: float = 30.0) -> str:
        """Wait until the job ended, whatever the way; return its final state."""
        return self.wait_state(jobid, FINISHED_STATES, timeout)

    def wait_no_jobs(self, timeout: float = 30.0) -> None:
        """Wait until the controller has no pending, running or completing job (a job an
        earlier test cancelled ends a moment after its scancel)."""
        deadline = time.monotonic() + timeout
        while self.run(["squeue", "-h", "-t", "PD,R,CG,S", "-o", "%A"], check=False).strip():
            if time.monotonic() > deadline:
                raise SlurmError(f"jobs still active after {timeout}s:\n"
                                 f"{self.run(['squeue'], check=False)}")
            time.sleep(0.2)

    def cancel(self, jobid: int) -> None:
        """Cancel a job (no error when it already ended)."""
        self.run(["scancel", str(jobid)], check=False)

    def sacct(self, jobids: Iterable[int]) -> dict[str, dict[str, str]]:
        """What Slurm accounting (slurmdbd) holds of the jobs: SACCT_FIELDS by job id."""
        ids = ",".join(str(j) for j in jobids)
        out = self.run(["sacct", "-X", "-n", "-P", "-j", ids, "-o", ",".join(SACCT_FIELDS)])
        rows = [dict(zip(SACCT_FIELDS, line.split("|"), strict=True))
                for line in out.splitlines() if line.count("|") == len(SACCT_FIELDS) - 1]
        return {row["JobIDRaw"]: row for row in rows}

    def wait_accounted(self, jobids: Collection[int], timeout: float = 30.0
                       ) -> dict[str, dict[str, str]]:
        """Wait until sacct has every job with its end time (slurmctld sends it to slurmdbd
        a moment after the job ends); return their records."""
        deadline = time.monotonic() + timeout
        while True:
            rows = self.sacct(jobids)
            if all(rows.get(str(j), {}).get("End", "Unknown") not in ("Unknown", "")
                   for j in jobids):
                return rows
            if time.monotonic() > deadline:
                raise SlurmError(f"sacct has no end of jobs {sorted(jobids)} after "
                                 f"{timeout}s: {rows}")
            time.sleep(0.2)

    def array_task_job_ids(self, array_jobid: int) -> dict[int, int]:
        """Map array task id -> the task's own job id.

        Slurm 22.05 gives prolog/epilog no SLURM_ARRAY_* variables, and the base job id
        may belong to any task (the last one to be split off), not to task 1. Tasks
        still pending as one record (``ArrayTaskId=1-3``) are not in the result.
        """
        tasks: dict[int, int] = {}
        for record in self.job_info(array_jobid):
            task = record.get("ArrayTaskId", "")
            if task.isdigit():
                tasks[int(task)] = int(record["JobId"])
        return tasks

    def wait_output(self, jobid: int, text: str, timeout: float = 15.0) -> str:
        """Wait until the job's output contains ``text``; return the whole output."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.output(jobid)
            if text in out:
                return out
            state = self.state(jobid)
            if state in FINISHED_STATES or time.monotonic() > deadline:
                raise SlurmError(f"job {jobid} ({state}) did not write {text!r}; output:\n{out}")
            time.sleep(0.05)

    def output(self, jobid: int) -> str:
        """The job's stdout/stderr so far (``jobs_dir/<jobid>.out``)."""
        path = self.jobs_dir / f"{jobid}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- cgroups and processes ----------------------------------------------------------

    def job_cgroup_dir(self, jobid: int, controller: str = "freezer") -> Path | None:
        """``<root>/<controller>/slurm_<node>/uid_<uid>/job_<id>`` if it exists."""
        matches = sorted((self.cgroup_root / controller).glob(f"slurm*/uid_*/job_{jobid}"))
        return matches[0] if matches else None

    @property
    def cgroup_prefix(self) -> str:
        """The Slurm root under each controller: ``slurm_<node>`` from Debian's packages
        (built with multiple-slurmd), ``slurm`` from a release built from its source."""
        return "slurm" if self.version >= (25, 11) else f"slurm_{self.node_name}"

    def expected_job_cgroup_dir(self, jobid: int, uid: int, controller: str) -> Path:
        """Where this release puts the job's cgroup for this node."""
        node_dir = self.cgroup_root / controller / self.cgroup_prefix
        return node_dir / f"uid_{uid}" / f"job_{jobid}"

    def job_controllers(self, jobid: int) -> set[str]:
        """The cgroup controllers that have a directory for this job."""
        return {
            d.name
            for d in self.cgroup_root.iterdir()
            if d.is_dir() and self.job_cgroup_dir(jobid, d.name) is not None
        }

    def job_pids(self, jobid: int, step: str | None = None) -> set[int]:
        """Pids of the job's processes (one step: "batch", "extern", "0", ...).

        Read from freezer, where a step's processes sit in the step directory itself;
        slurmstepd sits in the job directory and is left out.
        """
        job_dir = self.job_cgroup_dir(jobid, "freezer")
        if job_dir is None:
            return set()
        step_dirs = [job_dir / f"step_{step}"] if step is not None else job_dir.glob("step_*")
        pids: set[int] = set()
        for step_dir in step_dirs:
            for procs in [step_dir / "cgroup.procs", *step_dir.glob("**/task_*/cgroup.procs")]:
                try:
                    pids.update(int(p) for p in procs.read_text().split())
                except FileNotFoundError:
                    continue
        return pids

    def command_pid(self, jobid: int, command: str, step: str = "batch") -> int | None:
        """The pid of the step's process named ``command`` (its comm), or None yet."""
        for pid in self.job_pids(jobid, step):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == command:
                    return pid
            except OSError:
                continue
        return None

    def spool_gpus(self, jobid: int) -> list[int] | None:
        """The GPU indices the prolog recorded for the job, or None before it has."""
        try:
            text = json.loads((self.spool_dir / f"{jobid}.json").read_text())["job_gpus"]
            return [int(g) for g in str(text).split(",")]
        except (OSError, ValueError, KeyError):
            return None

    def gpu_record(self, jobid: int | str) -> dict[str, Any] | None:
        """The prolog's spool record of a GPU job, or None before it names the GPUs."""
        try:
            record = json.loads((self.spool_dir / f"{jobid}.json").read_text())
        except (FileNotFoundError, ValueError):
            return None
        return record if record.get("job_gpus") else None

    def wait_for_process(self, jobid: int, step: str = "batch", timeout: float = 15.0) -> set[int]:
        """Wait for the step's first process; return the step's pids.

        squeue/scontrol say RUNNING while the prolog still runs, and the batch script
        starts a moment after the prolog ends, so tests must wait for this.
        """
        deadline = time.monotonic() + timeout
        while True:
            pids = self.job_pids(jobid, step)
            if pids:
                return pids
            state = self.state(jobid)
            if state in FINISHED_STATES:
                raise SlurmError(f"job {jobid} ended {state} before step {step} had a process")
            if time.monotonic() > deadline:
                raise SlurmError(
                    f"job {jobid} ({state}) has no process in step {step} after {timeout}s\n"
                    + self.log_tail()
                )
            time.sleep(0.05)

    @staticmethod
    def process_environ(pid: int) -> dict[str, str]:
        """The initial environment of a process (/proc/<pid>/environ)."""
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        env: dict[str, str] = {}
        for entry in raw.split(b"\0"):
            key, sep, value = entry.partition(b"=")
            if sep:
                env[key.decode(errors="replace")] = value.decode(errors="replace")
        return env

    @staticmethod
    def process_cgroups(pid: int) -> Mapping[str, str]:
        """``/proc/<pid>/cgroup`` as controller -> path (v1 lines only)."""
        result: dict[str, str] = {}
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(","):
                if controller:
                    result[controller] = path
        return result
