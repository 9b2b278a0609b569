"""End to end: the real agent against the real one-node Slurm 22.05 (cgroup v1).

Jobs are submitted with sbatch as the normal users sgeuser/sgeuser2 with
``--gres=gpu:2``; slurmd itself runs the repository's prolog and epilog, which write
the job records into the cluster's spool directory. The agent runs as a subprocess
(tests/support/agent.py) over the real /sys/fs/cgroup and /proc, with the Slurm CLI for
look-ups, ``--sample-interval 1`` and ``--job-linger 3``, and a fresh state dir.

Every test ends its jobs and agents in finally blocks (the context managers below).
The ``jobacct_gather/none`` tests sit in one class whose fixture switches the cluster
(about 3.5 s: slurmctld and slurmd restart) and switches it back after the class.
Tests of known agent bugs come after the tests that pass, so ``pytest -x`` runs every
passing test before it stops.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import pytest

from tests.support import wait_until
from tests.support.agent import Agent, series
from tests.support.slurmcluster import ACCOUNTS, SlurmCluster, SlurmError

INTERVAL = 1.0  # --sample-interval
LINGER = 3.0  # --job-linger
GRACE = 2.0  # --cgroup-grace where a test depends on it
MiB = 1 << 20

T = TypeVar("T")

pytestmark = pytest.mark.every_release


# -- jobs ---------------------------------------------------------------------------


def burn_script(seconds: int = 30, mem_mib: int = 64, first_burn_s: float = 0.0) -> str:
    """A batch script that holds ``mem_mib`` MiB and keeps half a core busy.

    With ``first_burn_s``, a first python3 process burns that much CPU time at full
    speed and exits (the job prints ``burnt``) before the long-running one starts.
    The long-running process prints ``ready`` once its memory is touched.
    """
    first = ""
    if first_burn_s:
        first = f"""python3 -c '
import time
end = time.process_time() + {first_burn_s}
while time.process_time() < end:
    pass
'
echo burnt
"""
    return f"""#!/bin/sh
{first}exec python3 -c '
import time
buf = b"x" * ({mem_mib} << 20)
print("ready", flush=True)
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    busy = time.monotonic() + 0.2
    while time.monotonic() < busy:
        pass
    time.sleep(0.2)
'
"""


@contextlib.contextmanager
def running_job(
    cluster: SlurmCluster,
    script: str,
    user: str = "sgeuser",
    extra_args: Iterable[str] = (),
    wait: bool = True,
) -> Iterator[int]:
    """Submit a --gres=gpu:2 job and (``wait``) wait for its batch process; cancel it at the end."""
    jobid = cluster.submit(script, user=user, gres="gpu:2", extra_args=extra_args)
    try:
        if wait:
            cluster.wait_state(jobid, "RUNNING", timeout=30)
            cluster.wait_for_process(jobid, step="batch", timeout=15)
        yield jobid
    finally:
        cluster.cancel(jobid)
        with contextlib.suppress(SlurmError):
            cluster.wait_finished(jobid, timeout=30)


def scontrol_job(cluster: SlurmCluster, jobid: int) -> dict[str, str]:
    """``scontrol -o show job`` of one job as a dict."""
    records = [r for r in cluster.job_info(jobid) if r.get("JobId") == str(jobid)]
    assert records, f"scontrol does not know job {jobid}"
    return records[0]


def scontrol_gpu_indices(cluster: SlurmCluster, jobid: int) -> list[int]:
    """The job's GPU indices on this node from ``scontrol -d`` (``GRES=gpu:2(IDX:0-1)``)."""
    out = cluster.run(["scontrol", "-o", "-d", "show", "job", str(jobid)])
    match = re.search(r"\(IDX:([0-9,-]+)\)", out)
    assert match, out
    indices: list[int] = []
    for item in match.group(1).split(","):
        lo, _, hi = item.partition("-")
        indices.extend(range(int(lo), int(hi or lo) + 1))
    return indices


def tres_memory_bytes(tres: str) -> int:
    """``mem=`` of a TRES string such as ``cpu=1,mem=256M,node=1``, in bytes."""
    match = re.search(r"(?:^|,)mem=([0-9.]+)([KMGT]?)", tres)
    assert match, tres
    scale = {"": MiB, "K": 1 << 10, "M": MiB, "G": 1 << 30, "T": 1 << 40}[match.group(2)]
    return int(float(match.group(1)) * scale)


# -- the agent ----------------------------------------------------------------------


@contextlib.contextmanager
def running_agent(
    cluster: SlurmCluster,
    tmp_path: Path,
    state_dir: Path | None = None,
    log_name: str = "agent.log",
    extra_args: Iterable[str] = (),
) -> Iterator[Agent]:
    """The real agent on this node, ready (first sample taken); stopped at the end."""
    args = [
        "--spool-dir",
        str(cluster.spool_dir),
        "--state-dir",
        str(state_dir or tmp_path / "state"),
        "--cgroup-root",
        str(cluster.cgroup_root),
        "--proc-root",
        "/proc",
        "--sample-interval",
        str(INTERVAL),
        "--job-linger",
        str(LINGER),
        "--slurm-lookup",
        "cli",
        "--node-name",
        cluster.node_name,
        *extra_args,
    ]
    path = os.environ.get("PATH", "")
    env = {
        "SLURM_CONF": str(cluster.slurm_conf),
        "PATH": f"{cluster.path}:{path}" if path else cluster.path,
    }
    agent = Agent(args, env, tmp_path / log_name,
                  command=cluster.site_command("slurm-gpu-exporter"))
    try:
        agent.wait_ready()
        yield agent
    finally:
        agent.stop()


@dataclass(frozen=True)
class Scrape:
    """One GET /metrics and the wall-clock time it was taken."""

    text: str
    at: float

    def value(self, name: str, **labels: str) -> float | None:
        found = [
            v
            for got, v in series(self.text, name)
            if all(got.get(k) == want for k, want in labels.items())
        ]
        assert len(found) <= 1, (name, labels, found)
        return found[0] if found else None

    def job(self, name: str, jobid: int) -> float | None:
        return self.value(name, jobid=str(jobid))

    def info(self, jobid: int) -> list[dict[str, str]]:
        return [
            labels
            for labels, _ in series(self.text, "slurm_job_info")
            if labels.get("jobid") == str(jobid)
        ]

    def mentions(self, jobid: int) -> bool:
        return f'jobid="{jobid}"' in self.text

    def spool_errors(self) -> float:
        return self.value("slurm_gpu_exporter_sample_errors_total", source="spool") or 0.0


def scrape(agent: Agent) -> Scrape:
    now = time.time()
    return Scrape(agent.metrics(), now)


def wait_scrape(
    agent: Agent,
    what: str,
    cond: Callable[[Scrape], bool],
    timeout: float = 5.0,
    poll: float = 0.05,
) -> Scrape:
    """The first scrape for which ``cond`` holds."""

    def probe() -> Scrape | None:
        s = scrape(agent)
        return s if cond(s) else None

    return wait_until(probe, timeout, what, poll=poll, log=agent.log)


def scrape_until_gone(agent: Agent, jobid: int, scrapes: list[Scrape], timeout: float) -> None:
    """Scrape until the job's series are gone, each scrape added to ``scrapes``."""

    def gone() -> bool:
        scrapes.append(scrape(agent))
        return not scrapes[-1].mentions(jobid)

    wait_until(gone, timeout, f"job {jobid}'s series to go", poll=0.1, log=agent.log)


def wait_samples(agent: Agent, count: int = 2) -> Scrape:
    """A scrape taken after the agent published ``count`` more samples."""
    first = scrape(agent).value("slurm_gpu_exporter_last_sample_timestamp_seconds")
    assert first is not None
    return wait_scrape(
        agent,
        f"{count} more samples",
        lambda s: (
            (s.value("slurm_gpu_exporter_last_sample_timestamp_seconds") or 0)
            >= first + (count - 0.5) * INTERVAL
        ),
        timeout=count * INTERVAL + 5,
    )


@contextlib.contextmanager
def epilog_writes_elsewhere(cluster: SlurmCluster, spool: Path) -> Iterator[None]:
    """Point the prolog/epilog's spool directory at ``spool`` until the block ends.

    The cluster's hooks read their spool directory from a file every time they run
    (scripts/slurm-testcluster); the file is restored byte for byte afterwards.
    """
    saved = cluster.hook_spool_file.read_bytes()
    try:
        cluster.hook_spool_file.write_text(f"{spool}\n")
        yield
    finally:
        cluster.hook_spool_file.write_bytes(saved)


# -- jobs recorded by the prolog ------------------------------------------------------


@pytest.mark.slurm
def test_prolog_recorded_gpu_job_is_exported_with_its_usage_and_goes_after_epilog_and_linger(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    cluster = slurm_cluster
    uid = cluster.uid("sgeuser")
    with running_agent(cluster, tmp_path) as agent:
        submitted = time.time()
        with running_job(
            cluster, burn_script(30), extra_args=["--job-name=sge-e2e-spool"], wait=False
        ) as jobid:
            record = cluster.spool_dir / f"{jobid}.json"
            # slurmd runs the prolog at allocation; it writes the record as root.
            written = wait_until(
                lambda: record.stat() if record.exists() else None, 30, "the prolog's record",
                poll=0.02,
            )
            assert written.st_uid == 0 and stat.S_ISREG(written.st_mode)
            first = wait_scrape(
                agent,
                f"job {jobid} on /metrics",
                lambda s: bool(s.info(jobid)),
                timeout=10,
                poll=0.02,
            )
            appeared_s = first.at - written.st_mtime
            assert appeared_s <= 2 * INTERVAL, f"job appeared {appeared_s:.2f} s after its record"

            info = first.info(jobid)
            assert info == [
                {
                    "jobid": str(jobid),
                    "user": "sgeuser",
                    "uid": str(uid),
                    "account": ACCOUNTS["sgeuser"][0],  # the user's default account
                    "partition": "debug",
                    "qos": scontrol_job(cluster, jobid)["QOS"],
                    "name": "sge-e2e-spool",
                    "array_job_id": "",
                    "array_task_id": "",
                    "source": "spool",
                }
            ], info
            assert first.job("slurm_job_gpus", jobid) == 2
            start = first.job("slurm_job_start_time_seconds", jobid)
            assert start is not None and submitted - 1 <= start <= time.time()
            assert start == json.loads(record.read_bytes())["start_time"]

            cluster.wait_for_process(jobid, step="batch", timeout=15)
            cluster.wait_output(jobid, "ready\n", timeout=20)
            # The 64 MiB the job touched, after the sample that follows "ready".
            s1 = wait_scrape(
                agent,
                "the job's memory in its working set",
                lambda s: (s.job("slurm_job_memory_used_bytes", jobid) or 0) >= 48 * MiB,
            )
            sjob = scontrol_job(cluster, jobid)
            assert s1.job("slurm_job_cpus", jobid) == int(sjob["NumCPUs"])
            limit = s1.job("slurm_job_memory_limit_bytes", jobid)
            memory_dir = cluster.job_cgroup_dir(jobid, "memory")
            assert memory_dir is not None
            assert limit == int((memory_dir / "memory.limit_in_bytes").read_text())
            assert limit == tres_memory_bytes(sjob.get("TRES") or sjob["AllocTRES"])
            used = s1.job("slurm_job_memory_used_bytes", jobid)
            assert used is not None and limit is not None and used < limit
            peak = s1.job("slurm_job_memory_peak_bytes", jobid)
            assert peak is not None and peak >= used
            cpu1 = s1.job("slurm_job_cpu_seconds_total", jobid)
            assert cpu1 is not None and cpu1 > 0
            # The agent counts the job's processes (extern sleep + batch python3) as
            # the freezer cgroup lists them.
            wait_scrape(
                agent,
                "slurm_job_processes == the job's pids",
                lambda s: s.job("slurm_job_processes", jobid) == len(cluster.job_pids(jobid)) >= 1,
            )

            s2 = wait_samples(agent, 2)
            cpu2 = s2.job("slurm_job_cpu_seconds_total", jobid)
            assert cpu2 is not None and cpu2 > cpu1, (cpu1, cpu2)
            # Half a core busy: about 0.5 s of CPU per second, never more than a core.
            assert cpu2 - cpu1 <= (s2.at - s1.at) + 2 * INTERVAL

            cancelled = time.time()
            cluster.cancel(jobid)
            ended = wait_scrape(
                agent,
                "slurm_job_end_time_seconds after scancel",
                lambda s: s.job("slurm_job_end_time_seconds", jobid) is not None,
                timeout=15,
            )
            end = ended.job("slurm_job_end_time_seconds", jobid)
            assert end is not None and cancelled - 0.5 <= end <= ended.at
            # The epilog, run by slurmd, marked the record ended.
            assert json.loads(record.read_bytes())["end_time"] == end
            assert ended.info(jobid) == info  # the same series while it lingers
            assert ended.job("slurm_job_start_time_seconds", jobid) == start

            gone = wait_scrape(
                agent,
                f"every series of job {jobid} gone",
                lambda s: not s.mentions(jobid),
                timeout=LINGER + 5,
            )
            assert gone.at - end >= LINGER - 0.1, "the job did not linger"
            assert not record.exists(), "the expired record is still in the spool"
            assert cluster.wait_finished(jobid) == "CANCELLED"


# -- jobs found in cgroups ----------------------------------------------------------


@contextlib.contextmanager
def discovered_job(cluster: SlurmCluster, user: str, name: str) -> Iterator[int]:
    """A running job whose spool record is deleted before any agent starts.

    The prolog (run by slurmd) still writes a record; deleting it stands for a node
    where the prolog is not installed, or an agent installed while jobs run.
    """
    with running_job(
        cluster, burn_script(30), user=user, extra_args=[f"--job-name={name}"]
    ) as jobid:
        record = cluster.spool_dir / f"{jobid}.json"
        assert record.is_file()
        record.unlink()
        yield jobid


@pytest.mark.slurm
def test_job_without_spool_record_is_discovered_from_its_cgroup_with_metadata_from_scontrol(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    cluster = slurm_cluster
    uid = cluster.uid("sgeuser2")
    with discovered_job(cluster, "sgeuser2", "sge-e2e-found") as jobid:
        indices = scontrol_gpu_indices(cluster, jobid)
        assert len(indices) == 2
        sjob = scontrol_job(cluster, jobid)
        scontrol_start = datetime.fromisoformat(sjob["StartTime"]).timestamp()
        with running_agent(cluster, tmp_path) as agent:
            # Found by the first cgroup scans: counted in samples (each scrape names the
            # sample it shows), not in seconds, which a loaded machine stretches.
            samples: set[float | None] = set()

            def shows_job(s: Scrape) -> bool:
                samples.add(s.value("slurm_gpu_exporter_last_sample_timestamp_seconds"))
                return bool(s.info(jobid))

            first = wait_scrape(agent, f"job {jobid} found in cgroups", shows_job, timeout=10)
            assert len(samples) <= 2, f"the job showed only in the agent's sample {len(samples)}"
            assert first.info(jobid) == [
                {
                    "jobid": str(jobid),
                    "user": "sgeuser2",
                    "uid": str(uid),
                    "account": ACCOUNTS["sgeuser2"][0],
                    "partition": "debug",
                    "qos": sjob["QOS"],
                    "name": "sge-e2e-found",
                    "array_job_id": "",
                    "array_task_id": "",
                    "source": "cgroup",
                }
            ]
            # The GPU count comes from `scontrol -d` (GRES IDX) for this node.
            assert first.job("slurm_job_gpus", jobid) == len(indices) == 2
            start = first.job("slurm_job_start_time_seconds", jobid)
            assert start is not None and abs(start - scontrol_start) < 1.5
            assert first.job("slurm_job_memory_limit_bytes", jobid) == tres_memory_bytes(
                sjob.get("TRES") or sjob["AllocTRES"]  # AllocTRES since 23.02
            )
            assert (first.job("slurm_job_processes", jobid) or 0) >= 1
            cpu1 = first.job("slurm_job_cpu_seconds_total", jobid)
            assert cpu1 is not None
            later = wait_samples(agent, 2)
            cpu2 = later.job("slurm_job_cpu_seconds_total", jobid)
            assert cpu2 is not None and cpu2 > cpu1
            assert later.info(jobid) == first.info(jobid)
            assert f"job {jobid} found in cgroups" in agent.log()
            assert not (cluster.spool_dir / f"{jobid}.json").exists()


# -- hostile spool entries ----------------------------------------------------------


def valid_record(jobid: str, uid: int = 0) -> bytes:
    return json.dumps(
        {
            "version": 1,
            "jobid": jobid,
            "uid": uid,
            "user": "root",
            "partition": "debug",
            "job_gpus": "0,1,2,3",
            "start_time": time.time(),
        }
    ).encode()


@pytest.mark.slurm
def test_hostile_spool_entries_are_refused_and_counted_and_other_jobs_are_unaffected(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    cluster = slurm_cluster
    spool = cluster.spool_dir
    user_uid = cluster.uid("sgeuser")
    outside = tmp_path / "outside.json"
    outside.write_bytes(valid_record("99998"))
    planted: list[Path] = []

    def plant(name: str, make: Callable[[Path], None]) -> None:
        path = spool / name
        planted.append(path)
        make(path)

    def remove_planted() -> None:
        for path in planted:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    def owned_by_user(path: Path) -> None:
        path.write_bytes(valid_record("99997", uid=user_uid))
        os.chown(path, user_uid, -1)

    hostile_ids = ("99999", "99998", "99997", "99996", "99995", "99994", "99993")
    try:
        with (
            running_agent(cluster, tmp_path) as agent,
            running_job(cluster, burn_script(30)) as jobid,
        ):
            before = wait_scrape(
                agent,
                f"job {jobid}",
                lambda s: s.job("slurm_job_cpu_seconds_total", jobid) is not None,
                timeout=10,
            )
            base = before.spool_errors()
            plant("99999.json", lambda p: p.write_bytes(b"\x00{garbage, not json"))
            plant("99998.json", lambda p: p.symlink_to(outside))  # valid record behind it
            plant("99997.json", owned_by_user)  # valid, but a user could have written it
            plant("99996.json", lambda p: os.mkfifo(p))  # a reader without O_NONBLOCK hangs
            plant("99995.json", lambda p: p.mkdir())
            plant("99994.json", lambda p: p.write_bytes(b" " * (1 << 20)))
            plant("099993.json", lambda p: p.write_bytes(valid_record("99993")))
            plant("notajob.json", lambda p: p.write_bytes(valid_record("99992")))
            assert stat.S_ISLNK((spool / "99998.json").lstat().st_mode)

            wait_scrape(
                agent,
                f"{len(planted)} refused spool entries counted",
                lambda s: s.spool_errors() >= base + len(planted),
            )
            after = wait_samples(agent, 2)
            # Counted once per file, not once per sample.
            assert after.spool_errors() == base + len(planted)
            assert after.value("slurm_gpu_exporter_source_up", source="spool") == 1
            assert agent.proc.poll() is None
            assert agent.get("/-/healthy")[0] == 200
            for hostile in (*hostile_ids, "99992"):
                assert not after.mentions(int(hostile)), hostile
            log = agent.log()
            for path in planted:
                assert f"'{path.name}'" in log, path.name

            # The real job is untouched: same record, same labels, still counting.
            assert after.info(jobid) == before.info(jobid)
            assert after.info(jobid)[0]["source"] == "spool"
            cpu_before = before.job("slurm_job_cpu_seconds_total", jobid)
            cpu_after = after.job("slurm_job_cpu_seconds_total", jobid)
            assert cpu_before is not None and cpu_after is not None
            assert cpu_after > cpu_before
            assert (spool / f"{jobid}.json").is_file()
    finally:
        remove_planted()


# -- restarts -----------------------------------------------------------------------


def restart_and_compare(
    cluster: SlurmCluster, tmp_path: Path, jobid: int, ready_after: Callable[[Scrape], bool]
) -> tuple[float, float, float]:
    """Run an agent until ``ready_after``, restart it on the same state dir.

    Returns (last value before, first value after, value 3 s later) of the job's
    slurm_job_cpu_seconds_total.
    """
    state = tmp_path / "state"
    with running_agent(cluster, tmp_path, state_dir=state, log_name="agent1.log") as agent:
        last = wait_scrape(agent, "the first agent's reading", ready_after, timeout=20)
        start = last.job("slurm_job_start_time_seconds", jobid)
        last = wait_samples(agent, 1)
        before = last.job("slurm_job_cpu_seconds_total", jobid)
        assert before is not None
    assert (state / "state.json").is_file()
    with running_agent(cluster, tmp_path, state_dir=state, log_name="agent2.log") as agent:
        first = wait_scrape(
            agent,
            f"job {jobid} after the restart",
            lambda s: s.job("slurm_job_cpu_seconds_total", jobid) is not None,
        )
        after = first.job("slurm_job_cpu_seconds_total", jobid)
        assert after is not None
        assert first.job("slurm_job_start_time_seconds", jobid) == start
        later = wait_samples(agent, 3)
        grown = later.job("slurm_job_cpu_seconds_total", jobid)
        assert grown is not None
    return before, after, grown


# -- requeues ------------------------------------------------------------------------


@pytest.mark.slurm
def test_requeued_job_counts_cpu_seconds_from_the_start_of_its_new_run(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """A job requeued onto the same node keeps its id; its new run counts from zero.

    Counters kept by job id alone stay flat at the first run's total until the new
    run's own CPU time passes it.
    """
    cluster = slurm_cluster
    with (
        running_agent(cluster, tmp_path) as agent,
        running_job(cluster, burn_script(60), extra_args=["--requeue"]) as jobid,
    ):
        first = wait_scrape(
            agent,
            "3 s of CPU in the first run",
            lambda s: (s.job("slurm_job_cpu_seconds_total", jobid) or 0) >= 3.0,
            timeout=30,
        )
        old_start = first.job("slurm_job_start_time_seconds", jobid)
        assert old_start is not None
        cluster.run(["scontrol", "requeue", str(jobid)])
        cluster.wait_state(jobid, "PENDING", timeout=30)
        record = cluster.spool_dir / f"{jobid}.json"
        wait_until(
            lambda: cluster.job_cgroup_dir(jobid) is None
            and (not record.exists() or json.loads(record.read_bytes())["end_time"]),
            30,
            "the first run's epilog and the end of its cgroup",
        )
        # slurmd refuses a credential issued in the same second as the kill of the first
        # run ("Job credential revoked"); it compares whole seconds.
        time.sleep(1.1)
        # A requeued job waits about two minutes before it may start again.
        cluster.run(["scontrol", "update", f"jobid={jobid}", "starttime=now"])
        cluster.wait_state(jobid, "RUNNING", timeout=30)
        cluster.wait_for_process(jobid, step="batch", timeout=15)

        def new_run(s: Scrape) -> bool:
            start = s.job("slurm_job_start_time_seconds", jobid) or 0
            return start > old_start and (s.job("slurm_job_processes", jobid) or 0) > 0

        s1 = wait_scrape(agent, "the new run's processes", new_run, timeout=20)
        new_start = s1.job("slurm_job_start_time_seconds", jobid)
        cpu1 = s1.job("slurm_job_cpu_seconds_total", jobid)
        assert new_start is not None and cpu1 is not None
        # One CPU: the new run cannot have used more CPU time than wall time since it began.
        assert cpu1 <= s1.at - new_start + INTERVAL, (
            f"the new run shows {cpu1:.2f} s of CPU {s1.at - new_start:.2f} s after its start "
            "(the first run's total carried over)"
        )
        s2 = wait_samples(agent, 3)
        cpu2 = s2.job("slurm_job_cpu_seconds_total", jobid)
        assert cpu2 is not None and cpu2 > cpu1, (cpu1, cpu2)


# -- a node without cpuacct job cgroups ---------------------------------------------------


@pytest.fixture(scope="class")
def cluster_without_cpuacct(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster with JobAcctGatherType=jobacct_gather/none, for one test class.

    Switched back after the class's last test, so the tests after it run on the usual
    cluster. Switching restarts slurmctld and slurmd: about 3.5 s each way, with no
    job running.
    """
    previous = slurm_cluster.jobacct
    try:
        slurm_cluster.wait_no_jobs()
        slurm_cluster.up(jobacct="none")
        yield slurm_cluster
    finally:
        slurm_cluster.wait_no_jobs()
        slurm_cluster.up(jobacct=previous)


@pytest.mark.slurm
@pytest.mark.host_release  # summing processes' CPU is ours; cpuacct dirs are tested by the others
class TestNodeWithoutCpuacctJobCgroups:
    """JobAcctGatherType=jobacct_gather/none: no cpuacct job cgroups, CPU from processes."""

    def test_cpu_seconds_grow_from_processes_on_a_node_without_cpuacct_job_cgroups(
        self, cluster_without_cpuacct: SlurmCluster, tmp_path: Path
    ) -> None:
        cluster = cluster_without_cpuacct
        with (
            running_agent(cluster, tmp_path) as agent,
            running_job(cluster, burn_script(30, first_burn_s=3.0)) as jobid,
        ):
            controllers = cluster.job_controllers(jobid)
            assert "cpuacct" not in controllers and "freezer" in controllers, controllers
            s1 = wait_scrape(
                agent,
                f"job {jobid} using CPU",
                lambda s: (s.job("slurm_job_cpu_seconds_total", jobid) or 0) > 0.5,
                timeout=10,
            )
            cpu1 = s1.job("slurm_job_cpu_seconds_total", jobid)
            s2 = wait_samples(agent, 2)
            cpu2 = s2.job("slurm_job_cpu_seconds_total", jobid)
            assert cpu1 is not None and cpu2 is not None and cpu2 > cpu1
            assert cpu2 - cpu1 <= (s2.at - s1.at) + 2 * INTERVAL
            # The first process burnt 3 s of CPU and exited: its time is kept (what it
            # used after the last sample before its exit may be lost).
            cluster.wait_output(jobid, "ready\n", timeout=20)
            kept = wait_samples(agent, 1)
            cpu3 = kept.job("slurm_job_cpu_seconds_total", jobid)
            assert cpu3 is not None and cpu3 >= 3.0 - INTERVAL, cpu3
            s4 = wait_samples(agent, 2)
            cpu4 = s4.job("slurm_job_cpu_seconds_total", jobid)
            assert cpu4 is not None and cpu4 > cpu3

    def test_agent_restart_neither_lowers_nor_stalls_cpu_seconds_summed_from_processes(
        self, cluster_without_cpuacct: SlurmCluster, tmp_path: Path
    ) -> None:
        cluster = cluster_without_cpuacct
        """A process that exited before the restart must not be lost from the counter.

        The job burns 3 s of CPU in a first process, then half a core in a second one.
        The "stalls" half guards against saving only the counter's floor in the state
        dir: without the per-process accumulator (procfs.ProcessCpuAccumulator, saved
        with it now), the counter stayed flat after a restart until the live
        processes' own CPU time passed the floor, and the exited process's CPU was lost.
        """
        with running_job(cluster, burn_script(30, first_burn_s=3.0)) as jobid:
            # The first agent sees the first process and then the second one.
            before, after, grown = restart_and_compare(
                cluster,
                tmp_path,
                jobid,
                lambda s: (
                    "ready\n" in cluster.output(jobid)
                    and (s.job("slurm_job_cpu_seconds_total", jobid) or 0) >= 3.0 - INTERVAL
                ),
            )
            assert after >= before, f"restart lowered the counter: {before} -> {after}"
            # About 1.5 s of CPU in the 3 samples after the restart on an idle machine,
            # a few tenths on a loaded one; a stalled counter does not move at all (it
            # holds the floor until the live process's own time passes it).
            assert grown - after >= 0.05, (
                f"slurm_job_cpu_seconds_total stalled after the restart: {before:.2f} before, "
                f"{after:.2f} -> {grown:.2f} over 3 samples while the job kept half a core busy"
            )


# -- faults found here once, each docstring says which -------------------------------


@pytest.mark.slurm
def test_discovered_job_keeps_its_start_time_and_info_series_while_it_lingers_after_the_epilog(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The epilog of a job found in cgroups writes a record without a start time.

    That record must neither drop the job's start time nor turn its slurm_job_info
    into a second series (source="cgroup" -> "spool") for the last moments of its life.
    It guards against what job_of (now in jobs/tracked.py) once did: take start_time
    and source="spool" from whatever record exists, though the epilog's record has
    start_time None.
    """
    cluster = slurm_cluster
    with (
        discovered_job(cluster, "sgeuser", "sge-e2e-found-end") as jobid,
        running_agent(cluster, tmp_path) as agent,
    ):
        first = wait_scrape(
            agent, f"job {jobid} found in cgroups", lambda s: bool(s.info(jobid)), timeout=10
        )
        start = first.job("slurm_job_start_time_seconds", jobid)
        assert start is not None
        cluster.cancel(jobid)
        scrapes = [first]
        scrape_until_gone(agent, jobid, scrapes, 20)
        lingering = [s for s in scrapes if s.job("slurm_job_end_time_seconds", jobid) is not None]
        assert lingering, "slurm_job_end_time_seconds never appeared"
        record = cluster.spool_dir / f"{jobid}.json"
        assert not record.exists(), "the epilog's record outlived the job"

        problems = []
        no_start = [
            s.at
            for s in scrapes
            if s.mentions(jobid) and s.job("slurm_job_start_time_seconds", jobid) != start
        ]
        if no_start:
            problems.append(
                f"slurm_job_start_time_seconds missing or changed in "
                f"{len(no_start)} of {len(scrapes)} scrapes of the job"
            )
        infos: list[dict[str, str]] = []  # distinct label sets, in order of appearance
        for s in scrapes:
            infos.extend(labels for labels in s.info(jobid) if labels not in infos)
        if len(infos) != 1:
            problems.append(
                "slurm_job_info changed labels during the job's life: source "
                + " -> ".join(labels["source"] for labels in infos)
            )
        assert not problems, "; ".join(problems)


# -- a job whose epilog never reaches the agent ------------------------------------------


@pytest.mark.slurm
def test_job_whose_epilog_never_reaches_the_spool_ends_after_cgroup_grace_keeping_its_counters(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The job's record is never marked ended: its cgroup going is the only sign.

    Real: slurmd runs the epilog, but the epilog writes to another directory
    (the hooks' spool changed after the prolog ran), so the agent's
    spool keeps an unended record. A slow epilog looks the same to the agent until it
    finishes: Slurm removes the job's cgroups before it runs the epilog.
    It guards against two faults found here once: JobStatsCollector._sample
    (jobs/stats.py) returned an empty sample for a running job without a cgroup, so its
    counters vanished until it expired (it keeps the last figures now); and the
    tracker expired the job counting from when the cgroup went, so it lingered
    --job-linger minus --cgroup-grace seconds, not at all when grace >= linger (it
    counts from when it learnt the job ended now: TrackedJob.mark_ended).
    """
    cluster = slurm_cluster
    elsewhere = tmp_path / "elsewhere"
    with (
        running_agent(cluster, tmp_path, extra_args=["--cgroup-grace", str(GRACE)]) as agent,
        running_job(cluster, burn_script(30)) as jobid,
    ):
        record = cluster.spool_dir / f"{jobid}.json"
        running = wait_scrape(
            agent,
            f"job {jobid} using CPU",
            lambda s: (s.job("slurm_job_cpu_seconds_total", jobid) or 0) > 0.2,
            timeout=10,
        )
        cpu = running.job("slurm_job_cpu_seconds_total", jobid)
        assert cpu is not None
        with epilog_writes_elsewhere(cluster, elsewhere):
            cancelled = time.time()
            cluster.cancel(jobid)
            cluster.wait_finished(jobid)
            wait_until(
                lambda: (elsewhere / f"{jobid}.json").exists(), 15, "the epilog's record elsewhere"
            )
        assert json.loads(record.read_bytes())["end_time"] is None
        scrapes = [running]
        scrape_until_gone(agent, jobid, scrapes, GRACE + LINGER + 10)
        assert "cgroup gone without an epilog" in agent.log()
        assert not record.exists(), "the expired record is still in the spool"

        problems = []
        present = [s for s in scrapes[1:] if s.mentions(jobid)]
        lost = [s for s in present if (s.job("slurm_job_cpu_seconds_total", jobid) or -1) < cpu]
        if lost:
            problems.append(
                f"slurm_job_cpu_seconds_total missing or lower than {cpu:.2f} in {len(lost)} "
                f"of {len(present)} scrapes after the cgroup went"
            )
        ended = [s for s in present if s.job("slurm_job_end_time_seconds", jobid) is not None]
        if not ended:
            problems.append("slurm_job_end_time_seconds never appeared")
        else:
            end = ended[0].job("slurm_job_end_time_seconds", jobid)
            assert end is not None and end >= cancelled - 0.5
            if ended[0].at - end < GRACE - 0.1:
                problems.append(
                    f"marked ended {ended[0].at - end:.2f} s after the cgroup "
                    f"went, before --cgroup-grace {GRACE:g}"
                )
            shown = scrapes[-1].at - ended[0].at
            if shown < LINGER - INTERVAL:
                problems.append(
                    f"the ended job lingered {shown:.2f} s, not --job-linger {LINGER:g} s"
                )
        assert not problems, "; ".join(problems)
