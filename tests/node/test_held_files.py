"""Cgroup files the sampler keeps open (``HeldFiles``) read the kernel's current
values, fail once their cgroup is removed, and find a cgroup made again at the same
path; regular files (a synthetic tree, the simulated node) are never held;
``cgroup.procs`` is held under a rule of its own.

On a real cgroup this node mounts (v1 cpuacct, else the v2 tree), with a real busy
process moved in and out.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu_exporter.node.cgroup import CgroupFS, CgroupGone
from slurm_gpu_exporter.node.cgroup.files import read_int, read_keyed, read_procs
from slurm_gpu_exporter.node.kernelfile import HeldFiles
from tests.support import require

pytestmark = [pytest.mark.process]

CGROUP = Path("/sys/fs/cgroup")


def accounting_file(name: str) -> tuple[Path, str]:
    """(a new cgroup's path, its CPU accounting file) on a hierarchy this node mounts."""
    require(os.geteuid() == 0, "making cgroups needs root")
    for base, file in ((CGROUP / "cpuacct", "cpuacct.usage"), (CGROUP, "cpu.stat")):
        if (base / file).exists() and os.access(base, os.W_OK):
            return base / name, file
    require(False, f"no writable cpuacct or v2 hierarchy under {CGROUP}")
    raise AssertionError  # unreachable: require fails


def cpu_used(held: HeldFiles, path: Path, file: str) -> int | None:
    if file == "cpu.stat":
        return read_keyed(f"{path}/{file}", "usage_usec", held.read)
    return read_int(f"{path}/{file}", held.read)


@contextlib.contextmanager
def busy_process() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def move(pid: int, to: Path) -> None:
    (to / "cgroup.procs").write_text(f"{pid}\n")


def test_a_held_cgroup_file_reads_current_values_and_follows_its_cgroup() -> None:
    path, file = accounting_file(f"sge-held-{os.getpid()}")
    held = HeldFiles(limit=16)
    path.mkdir()
    try:
        with busy_process() as busy:
            assert cpu_used(held, path, file) == 0
            assert len(held) == 1, "an accounting file is held"
            move(busy.pid, path)
            readings = []
            for _ in range(3):
                time.sleep(0.2)
                readings.append(cpu_used(held, path, file))
            assert readings == sorted(set(readings)) and readings[0], (
                f"a held file reads the kernel's current value each time: {readings}")
            move(busy.pid, path.parent)
            path.rmdir()
            assert cpu_used(held, path, file) is None, "a removed cgroup reads as gone"
            assert len(held) == 0
            path.mkdir()  # made again at the same path: a requeued job's new cgroup
            assert cpu_used(held, path, file) == 0, "the new cgroup's, not the old one's"
            assert len(held) == 1
    finally:
        held.close()
        with contextlib.suppress(FileNotFoundError):
            path.rmdir()


def test_a_held_cgroup_procs_reads_the_pids_of_now_however_soon_it_is_read_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # v1 keeps the pid list an open cgroup.procs loaded while reads use it within a
    # second: a held one is read only when its last read is old enough (real time, the
    # kernel's), one read sooner is opened afresh. Both, and empty <-> not, checked.
    path, _ = accounting_file(f"sge-held-procs-{os.getpid()}")
    held = HeldFiles(limit=16)
    held.PID_LIST_FRESH_S = 2.5  # the rule, a little shorter than 3 s (the test waits it out)
    procs = os.fspath(path)
    opens: list[str] = []
    real_open = os.open

    def counting_open(file: str, *args: int, **kwargs: int) -> int:
        opens.append(os.fspath(file))
        return real_open(file, *args, **kwargs)

    path.mkdir()
    try:
        with busy_process() as busy:
            monkeypatch.setattr(os, "open", counting_open)
            assert read_procs(procs, held.read) == [] and len(held) == 1
            move(busy.pid, path)
            assert read_procs(procs, held.read) == [busy.pid], "read again at once"
            assert len(opens) == 2, "opened afresh: the held one would read the kept list"
            time.sleep(2.6)
            assert read_procs(procs, held.read) == [busy.pid] and len(opens) == 2
            move(busy.pid, path.parent)
            time.sleep(2.6)
            assert read_procs(procs, held.read) == [] and len(opens) == 2
            move(busy.pid, path)
            time.sleep(2.6)
            assert read_procs(procs, held.read) == [busy.pid], "empty, then not"
            assert len(opens) == 2, "each read after the wait is the held file's"
            move(busy.pid, path.parent)
            assert read_procs(procs, held.read) == [] and len(opens) == 3
            path.rmdir()
            assert read_procs(procs, held.read) is None and len(held) == 0
    finally:
        monkeypatch.undo()
        held.close()
        with contextlib.suppress(FileNotFoundError):
            path.rmdir()


def test_regular_files_are_never_held_and_a_replaced_one_reads_anew(tmp_path: Path) -> None:
    held = HeldFiles(limit=16)
    usage = tmp_path / "cpuacct.usage"
    usage.write_text("0\n")
    assert read_int(os.fspath(usage), held.read) == 0
    replacement = tmp_path / "new"
    replacement.write_text("42\n")
    os.replace(replacement, usage)  # how the simulated node writes its files
    assert read_int(os.fspath(usage), held.read) == 42
    assert len(held) == 0


def test_past_its_limit_files_are_read_without_being_held() -> None:
    a, file = accounting_file(f"sge-held-a-{os.getpid()}")
    b = a.with_name(f"sge-held-b-{os.getpid()}")
    held = HeldFiles(limit=1)
    a.mkdir()
    b.mkdir()
    try:
        assert cpu_used(held, a, file) == 0
        assert cpu_used(held, b, file) == 0
        assert len(held) == 1
        held.keep_only(lambda p: not p.startswith(f"{a}/"))
        assert len(held) == 0, "the files of a job that went are closed"
    finally:
        held.close()
        a.rmdir()
        b.rmdir()


def test_the_sampler_holds_a_jobs_accounting_files_and_closes_them_when_it_goes() -> None:
    """CgroupFS over the real /sys/fs/cgroup with a v1 job tree of the test's own
    (``slurm_<name>/uid_0/job_<id>/step_0``) in every controller it reads."""
    require(os.geteuid() == 0, "making cgroups needs root")
    require((CGROUP / "cpuacct" / "cpuacct.usage").exists(), "a cgroup v1 node")
    top = f"slurm_sgeheld{os.getpid()}"
    made = []
    try:
        for ctrl in ("cpuacct", "memory", "freezer"):
            step = CGROUP / ctrl / top / "uid_0" / "job_990001" / "step_0"
            step.mkdir(parents=True)
            made.append(step)
        fs = CgroupFS(CGROUP, held_files=64)
        job = fs.find_jobs()["990001"]
        stats = fs.read_stats(job)
        assert stats.cpu_seconds == 0 and stats.memory_used_bytes is not None
        ours = [p for p in fs.held_files() if f"/{top}/" in p]
        assert sorted(os.path.basename(p) for p in ours) == [
            "cgroup.procs", "cpuacct.usage", "memory.max_usage_in_bytes",
            "memory.oom_control", "memory.stat", "memory.usage_in_bytes"]
        for step in made:
            step.rmdir()
            step.parent.rmdir()
        with pytest.raises(CgroupGone):
            fs.read_stats(job)
        assert "990001" not in fs.find_jobs()
        assert [p for p in fs.held_files() if f"/{top}/" in p] == []
        fs.close()
    finally:
        for step in made:
            for directory in (step, step.parent, step.parent.parent, step.parent.parent.parent):
                with contextlib.suppress(FileNotFoundError):
                    directory.rmdir()
