"""/proc readers, the pid -> job mapper and the per-process CPU accumulator."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_exporter.node.cgroup import CgroupFS
from slurm_gpu_exporter.node.cgroup.paths import SlurmRoot
from slurm_gpu_exporter.node.procfs import (
    PidJob,
    PidJobMapper,
    ProcessCpuAccumulator,
    ProcessGone,
    clock_ticks,
    read_cgroup_paths,
    read_environ_values,
    read_stat,
    read_uid,
)
from tests.support import FIXTURES, REPO, require

REAL = FIXTURES / "slurm-22.05"

V1_LINES = [
    "9:name=systemd:/",
    "6:freezer:/slurm/uid_1000/job_{job}/step_0",
    "4:memory:/slurm/uid_1000/job_{job}/step_0/task_0",
    "2:cpuacct:/slurm/uid_1000/job_{job}/step_0/task_0",
    "1:cpu:/",
    "0::/",
]
OUTSIDE_LINES = ["9:name=systemd:/user.slice/user-1000.slice/session-3.scope", "0::/"]
# Where the cgroup layer found Slurm's roots, for the lines above (v1) and for v2.
ROOTS = (
    SlurmRoot(frozenset({"freezer"}), "/slurm"),
    SlurmRoot(frozenset({"memory"}), "/slurm"),
    SlurmRoot(frozenset({"cpu", "cpuacct"}), "/slurm"),
    SlurmRoot(frozenset(), "/system.slice/slurmstepd.scope"),
)


def mapper_of(proc_root: Path, **options: Any) -> PidJobMapper:
    """A mapper told where Slurm's roots are, as the GPU sampler and the relay tell theirs."""
    mapper = PidJobMapper(proc_root, **options)
    mapper.slurm_roots = ROOTS
    return mapper


def make_proc(
    root: Path,
    pid: int,
    *,
    comm: str = "python3",
    ppid: int = 1,
    start: int = 1000,
    utime: int = 0,
    stime: int = 0,
    cgroup: list[str] | None = None,
    environ: dict[str, str] | None = None,
    uid: int = 1000,
) -> None:
    """Write the /proc/<pid> files the readers use, in the kernel's formats."""
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    # proc(5) fields 3..52 after "pid (comm)": state, ppid, ..., utime (14), stime (15),
    # ..., starttime (22), ...
    fields = ["S", str(ppid), str(pid), str(pid), "0", "-1", "4194560", "100", "0", "0", "0"]
    fields += [str(utime), str(stime), "0", "0", "20", "0", "1", "0", str(start)]
    fields += ["12345678", "512"] + ["0"] * 30
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
    (d / "cgroup").write_text("".join(line + "\n" for line in (cgroup or ["0::/"])))
    env = environ or {}
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
    (d / "status").write_text(
        f"Name:\t{comm[:15]}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\n"
        f"Pid:\t{pid}\nPPid:\t{ppid}\nUid:\t{uid}\t{uid + 1}\t{uid}\t{uid}\n"
        f"Gid:\t100\t100\t100\t100\n"
    )


def v1_cgroup(job: int) -> list[str]:
    return [line.format(job=job) for line in V1_LINES]


# --- single-file readers ---------------------------------------------------------------


def test_stat_with_paren_and_spaces_in_comm_is_parsed(tmp_path: Path) -> None:
    make_proc(tmp_path, 42, comm="a) (b c) ", ppid=7, start=98765, utime=150, stime=25)
    st = read_stat(tmp_path, 42)
    assert st.comm == "a) (b c) "
    assert (st.pid, st.ppid, st.start_ticks, st.utime_ticks, st.stime_ticks) == (
        42,
        7,
        98765,
        150,
        25,
    )


def test_stat_of_this_process_is_read_from_the_real_proc() -> None:
    st = read_stat(Path("/proc"), os.getpid())
    assert st.pid == os.getpid() and st.ppid == os.getppid()
    assert st.start_ticks > 0


def test_vanished_process_raises_process_gone(tmp_path: Path) -> None:
    for reader in (read_stat, read_cgroup_paths, read_uid):
        with pytest.raises(ProcessGone):
            reader(tmp_path, 4242)
    with pytest.raises(ProcessGone):
        read_environ_values(tmp_path, 4242, ["SLURM_JOB_ID"])


def test_malformed_stat_raises_value_error(tmp_path: Path) -> None:
    (tmp_path / "5").mkdir()
    (tmp_path / "5" / "stat").write_text("5 (x) S 1 2\n")
    with pytest.raises(ValueError):
        read_stat(tmp_path, 5)


def test_cgroup_paths_of_v1_and_v2_lines_are_listed(tmp_path: Path) -> None:
    make_proc(tmp_path, 10, cgroup=[*v1_cgroup(7), "3:cpuset:/odd:name"])
    paths = read_cgroup_paths(tmp_path, 10)
    assert paths[1] == "/slurm/uid_1000/job_7/step_0"
    assert paths[-2] == "/"  # the v2 line "0::/"
    assert paths[-1] == "/odd:name"  # a ':' inside the path is kept


def test_environ_value_is_found_or_none(tmp_path: Path) -> None:
    make_proc(tmp_path, 11, environ={"SLURM_JOB_ID": "55", "X": "a=b", "SLURM_JOB_IDX": "9"})
    assert read_environ_values(tmp_path, 11, ["SLURM_JOB_ID"]) == {"SLURM_JOB_ID": "55"}
    assert read_environ_values(tmp_path, 11, ["SLURM_STEP_ID"]) == {}
    assert read_environ_values(tmp_path, 11, ["X", "SLURM_JOB_IDX", "NOPE"]) == {
        "X": "a=b",
        "SLURM_JOB_IDX": "9",
    }


def test_real_uid_is_read_from_status(tmp_path: Path) -> None:
    make_proc(tmp_path, 12, uid=1234)  # effective uid differs: the real one is returned
    assert read_uid(tmp_path, 12) == 1234


def test_clock_ticks_is_the_systems_user_hz() -> None:
    assert clock_ticks() == os.sysconf("SC_CLK_TCK") > 0


@pytest.mark.process
def test_procfs_imports_only_the_standard_library() -> None:
    code = (
        "import sys, slurm_gpu_exporter.node.procfs\n"
        "known = set(sys.stdlib_module_names) | {'__main__'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} - known))"
    )
    # -S: without site-packages, anything beyond the stdlib fails to import.
    root = REPO
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "['slurm_gpu_exporter']"


# --- PidJobMapper --------------------------------------------------------------------


def test_mapper_maps_pid_through_v1_cgroup(tmp_path: Path) -> None:
    make_proc(tmp_path, 100, cgroup=v1_cgroup(31))
    assert mapper_of(tmp_path).job_of(100) == PidJob("31", "0", False, "cgroup")


def test_mapper_maps_pid_through_v2_sluid_cgroup(tmp_path: Path) -> None:
    path = "/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_batch/user/task_0"
    make_proc(tmp_path, 101, cgroup=[f"0::{path}"])
    assert mapper_of(tmp_path).job_of(101) == PidJob("sEKNKTV3WPV500", "batch", True, "cgroup")


def test_mapper_prefers_cgroup_over_environ(tmp_path: Path) -> None:
    make_proc(tmp_path, 102, cgroup=v1_cgroup(31), environ={"SLURM_JOB_ID": "99"})
    assert mapper_of(tmp_path).job_of(102) == PidJob("31", "0", False, "cgroup")


def test_mapper_falls_back_to_environ_without_slurm_cgroups(tmp_path: Path) -> None:
    make_proc(tmp_path, 103, environ={"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "2"})
    make_proc(tmp_path, 104, environ={"SLURM_JOB_ID": "77"})
    mapper = PidJobMapper(tmp_path)  # told no Slurm roots: the node has none
    assert mapper.job_of(103) == PidJob("77", "2", False, "environ")
    assert mapper.job_of(104) == PidJob("77", None, False, "environ")


def test_mapper_ignores_environ_when_the_fallback_is_off(tmp_path: Path) -> None:
    # On nodes with Slurm cgroups a user could forge SLURM_JOB_ID to blame another job.
    make_proc(tmp_path, 105, cgroup=OUTSIDE_LINES, environ={"SLURM_JOB_ID": "77"})
    assert mapper_of(tmp_path, environ_fallback=False).job_of(105) is None


def test_environ_answer_does_not_outlive_the_appearance_of_slurm_cgroups(tmp_path: Path) -> None:
    # Mapped through its (forgeable) environment while the node had no Slurm
    # cgroups; once they appear the fallback is off and the cached answer must go
    # with it, not be served while the process lives.
    make_proc(tmp_path, 105, cgroup=OUTSIDE_LINES, environ={"SLURM_JOB_ID": "77"})
    make_proc(tmp_path, 108, cgroup=v1_cgroup(31))
    mapper = PidJobMapper(tmp_path, clock=lambda: 0.0)
    assert mapper.job_of(105) == PidJob("77", None, False, "environ")
    mapper.slurm_roots = ROOTS  # slurmd made its roots
    assert not mapper.environ_fallback
    assert mapper.job_of(105) is None
    assert mapper.job_of(108) == PidJob("31", "0", False, "cgroup")


@pytest.mark.parametrize("value", ["", "abc", "12x", "-3", "0", "012"])
def test_mapper_rejects_malformed_environ_job_id(tmp_path: Path, value: str) -> None:
    make_proc(tmp_path, 106, environ={"SLURM_JOB_ID": value})
    assert mapper_of(tmp_path).job_of(106) is None


@pytest.mark.parametrize("line", [
    # A user's delegated systemd subtree (user@UID.service, Delegate=yes) on v2 ...
    "0::/user.slice/user-1000.slice/user@1000.service/app.slice/slurmstepd.scope/job_31/step_0",
    # ... on the v1 name=systemd tree, which Slurm never uses ...
    "9:name=systemd:/user.slice/user-1000.slice/user@1000.service/slurm/uid_1000/job_31/step_0",
    # ... and a look-alike in a real controller's tree, but not under Slurm's root.
    "6:freezer:/user.slice/slurm/uid_1000/job_31/step_0",
    "6:freezer:/slurm_other/uid_1000/job_31/step_0",
    # A v1 path on the v2 line and a v2 path on a v1 line.
    "0::/slurm/uid_1000/job_31/step_0",
    "4:memory:/system.slice/slurmstepd.scope/job_31/step_0",
])
def test_a_look_alike_cgroup_outside_slurms_roots_is_no_job(tmp_path: Path, line: str) -> None:
    make_proc(tmp_path, 112, cgroup=["1:cpu:/", line])
    assert mapper_of(tmp_path, environ_fallback=False).job_of(112) is None


def test_a_mapper_told_no_roots_maps_no_cgroup_to_a_job(tmp_path: Path) -> None:
    make_proc(tmp_path, 113, cgroup=v1_cgroup(31))
    assert PidJobMapper(tmp_path, environ_fallback=False).job_of(113) is None


def test_new_roots_drop_the_answers_given_before(tmp_path: Path) -> None:
    # slurmd makes some v1 roots only at its first job: "no job" must not be kept.
    make_proc(tmp_path, 114, cgroup=v1_cgroup(31))
    mapper = PidJobMapper(tmp_path, environ_fallback=False)
    assert mapper.job_of(114) is None
    mapper.slurm_roots = ROOTS
    assert mapper.job_of(114) == PidJob("31", "0", False, "cgroup")


def test_mapper_process_outside_every_job_is_none(tmp_path: Path) -> None:
    make_proc(tmp_path, 107, cgroup=OUTSIDE_LINES)
    assert mapper_of(tmp_path).job_of(107) is None


def test_mapper_swallows_process_gone(tmp_path: Path) -> None:
    assert mapper_of(tmp_path).job_of(4242) is None


def test_mapper_caches_by_pid_and_start_time(tmp_path: Path) -> None:
    make_proc(tmp_path, 108, cgroup=v1_cgroup(31))
    mapper = mapper_of(tmp_path)
    assert mapper.job_of(108) is not None
    # Same process (same start time): the cached answer stands, cgroup is not re-read.
    (tmp_path / "108" / "cgroup").unlink()
    assert mapper.job_of(108) == PidJob("31", "0", False, "cgroup")


def test_mapper_detects_pid_reuse(tmp_path: Path) -> None:
    make_proc(tmp_path, 109, start=1000, cgroup=v1_cgroup(31))
    mapper = mapper_of(tmp_path)
    assert mapper.job_of(109) == PidJob("31", "0", False, "cgroup")
    # The process exited and a new one of another job got the same pid.
    make_proc(tmp_path, 109, start=5000, cgroup=v1_cgroup(32))
    assert mapper.job_of(109) == PidJob("32", "0", False, "cgroup")


def test_mapper_rechecks_a_process_outside_jobs_after_the_ttl(tmp_path: Path) -> None:
    # pam_slurm_adopt can move a running process into a job's cgroup.
    now = [0.0]
    make_proc(tmp_path, 110, cgroup=OUTSIDE_LINES)
    mapper = mapper_of(tmp_path, negative_ttl=30.0, clock=lambda: now[0])
    assert mapper.job_of(110) is None
    make_proc(tmp_path, 110, cgroup=v1_cgroup(31))
    now[0] = 10.0
    assert mapper.job_of(110) is None
    now[0] = 31.0
    assert mapper.job_of(110) == PidJob("31", "0", False, "cgroup")


def test_mapper_cache_drops_pids_not_asked_for_recently(tmp_path: Path) -> None:
    now = [0.0]
    for pid in (200, 201, 202):
        make_proc(tmp_path, pid, cgroup=v1_cgroup(31))
    mapper = mapper_of(tmp_path, idle_seconds=100.0, clock=lambda: now[0])
    mapper.job_of(200)
    mapper.job_of(201)
    now[0] = 60.0
    mapper.job_of(201)
    now[0] = 150.0
    mapper.job_of(202)  # 200 was last asked at 0, 201 at 60
    assert len(mapper) == 2
    now[0] = 300.0
    mapper.job_of(202)
    mapper.job_of(203)  # gone: nothing is cached for it
    assert len(mapper) <= 2


def test_mapper_cache_is_bounded(tmp_path: Path) -> None:
    mapper = mapper_of(tmp_path, max_entries=3)
    for pid in range(300, 310):
        make_proc(tmp_path, pid, cgroup=v1_cgroup(31))
        assert mapper.job_of(pid) is not None
        assert len(mapper) <= 3


def test_mapper_gone_pid_is_dropped_from_the_cache(tmp_path: Path) -> None:
    make_proc(tmp_path, 111, cgroup=v1_cgroup(31))
    mapper = mapper_of(tmp_path)
    mapper.job_of(111)
    assert len(mapper) == 1
    for name in ("stat", "cgroup", "environ", "status"):
        (tmp_path / "111" / name).unlink()
    (tmp_path / "111").rmdir()
    assert mapper.job_of(111) is None
    assert len(mapper) == 0


# --- ProcessCpuAccumulator -----------------------------------------------------------


def test_accumulator_sums_the_jobs_processes(tmp_path: Path) -> None:
    make_proc(tmp_path, 400, utime=100, stime=50)
    make_proc(tmp_path, 401, utime=30, stime=20)
    acc = ProcessCpuAccumulator(tmp_path, ticks_per_second=100)
    assert acc.update("5", [400, 401]) == pytest.approx(2.0)


def test_accumulator_is_monotonic_across_a_process_exit(tmp_path: Path) -> None:
    make_proc(tmp_path, 410, utime=100, stime=100)
    make_proc(tmp_path, 411, utime=50, stime=50)
    acc = ProcessCpuAccumulator(tmp_path, ticks_per_second=100)
    assert acc.update("5", [410, 411]) == pytest.approx(3.0)
    # 411 exits: its last seen time stays counted.
    for name in ("stat", "cgroup", "environ", "status"):
        (tmp_path / "411" / name).unlink()
    make_proc(tmp_path, 410, utime=150, stime=100)
    assert acc.update("5", [410, 411]) == pytest.approx(3.5)
    assert acc.update("5", [410]) == pytest.approx(3.5)


def test_accumulator_detects_pid_reuse(tmp_path: Path) -> None:
    make_proc(tmp_path, 420, start=1000, utime=300)
    acc = ProcessCpuAccumulator(tmp_path, ticks_per_second=100)
    assert acc.update("5", [420]) == pytest.approx(3.0)
    # A new process with the same pid and less CPU time: the old 3 s stay, the new 1 s adds.
    make_proc(tmp_path, 420, start=9000, utime=100)
    assert acc.update("5", [420]) == pytest.approx(4.0)


def test_accumulator_does_not_count_twice_a_pid_missing_from_one_listing(
    tmp_path: Path,
) -> None:
    make_proc(tmp_path, 430, utime=200)
    make_proc(tmp_path, 431, utime=100)
    acc = ProcessCpuAccumulator(tmp_path, ticks_per_second=100)
    assert acc.update("5", [430, 431]) == pytest.approx(3.0)
    assert acc.update("5", [430]) == pytest.approx(3.0)  # 431 missed in this listing
    make_proc(tmp_path, 431, utime=150)
    assert acc.update("5", [430, 431]) == pytest.approx(3.5)


def test_accumulator_keeps_jobs_apart_and_forgets(tmp_path: Path) -> None:
    make_proc(tmp_path, 440, utime=100)
    make_proc(tmp_path, 441, utime=200)
    acc = ProcessCpuAccumulator(tmp_path, ticks_per_second=100)
    assert acc.update("5", [440]) == pytest.approx(1.0)
    assert acc.update("6", [441]) == pytest.approx(2.0)
    acc.forget("5")
    for name in ("stat", "cgroup", "environ", "status"):
        (tmp_path / "440" / name).unlink()
    assert acc.update("5", []) == 0.0
    assert acc.update("6", [441]) == pytest.approx(2.0)


# --- the real processes captured from Slurm 22.05 (cgroup v1) ------------------------------


def _real_proc() -> tuple[Path, str]:
    require(
        (REAL / "proc").is_dir() and (REAL / "capture.txt").is_file(),
        "no captured Slurm 22.05 processes in tests/fixtures/slurm-22.05",
    )
    m = re.search(r"^job: (\d+)$", (REAL / "capture.txt").read_text(), re.MULTILINE)
    assert m, "capture.txt names the job"
    return REAL / "proc", m.group(1)


def test_real_processes_all_map_to_the_captured_job() -> None:
    proc, job_id = _real_proc()
    mapper = PidJobMapper(proc, environ_fallback=False)
    mapper.slurm_roots = CgroupFS(REAL / "cgroup").proc_roots()
    pids = [int(p.name) for p in proc.iterdir()]
    assert pids
    steps = set()
    for pid in pids:
        job = mapper.job_of(pid)
        assert job is not None and job.job_key == job_id and job.source == "cgroup", pid
        steps.add(job.step)
    assert {"batch", "extern", "0"} <= steps


def test_real_task_environ_names_the_job() -> None:
    proc, job_id = _real_proc()
    tasks = [p for p in proc.iterdir() if read_stat(proc, int(p.name)).comm == "sleep"]
    values = {read_environ_values(proc, int(p.name), ["SLURM_JOB_ID"]).get("SLURM_JOB_ID")
              for p in tasks}
    # The extern step's sleep is started by slurmstepd as root, without the job's env.
    assert job_id in values
    assert read_uid(proc, int(tasks[0].name)) in (0, 1001)


def test_a_process_stat_is_read_with_one_read_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The pid -> job check reads every GPU process's stat on every sample.
    reads = []
    real_read = os.read

    def counting_read(fd: int, n: int) -> bytes:
        reads.append(n)
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", counting_read)
    st = read_stat(Path("/proc"), os.getpid())
    assert st.pid == os.getpid() and len(reads) == 1
