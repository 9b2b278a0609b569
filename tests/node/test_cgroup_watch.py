"""Slurm's cgroup roots are listed again only when inotify says they changed (issue 49).

Trees shaped like Slurm's (copies of the checked-in layouts, on the test's tmp dir:
inotify works there as on cgroupfs) are changed between calls of ``find_jobs``; what
it finds is compared with a plain walk of the same tree, and the listings are
counted through the ``names``/``subdirs`` that v1.py and v2.py list with.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_gpu_exporter.node.cgroup import CgroupFS, JobCgroup, v1, v2
from slurm_gpu_exporter.node.cgroup.inotify import IN_Q_OVERFLOW, Inotify
from slurm_gpu_exporter.node.cgroup.watch import DirWatch
from tests.support import FIXTURES, Clock, require

LAYOUTS = FIXTURES / "cgroup-layouts"


class Listings:
    """Counts the listings of a Slurm root; runs a one-shot action right after a
    directory's listing (a change made while find_jobs lists)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.roots = 0
        self.after: dict[str, Callable[[], None]] = {}
        real_names, real_subdirs = v1.names, v2.subdirs

        def names(directory: str) -> list[str]:
            out = real_names(directory)
            self._seen(directory, os.path.basename(directory).startswith("slurm"))
            return out

        def subdirs(directory: str) -> list[os.DirEntry[str]]:
            out = real_subdirs(directory)
            self._seen(directory, directory.endswith("slurmstepd.scope"))
            return out

        monkeypatch.setattr(v1, "names", names)
        monkeypatch.setattr(v2, "subdirs", subdirs)

    def _seen(self, directory: str, is_root: bool) -> None:
        self.roots += is_root
        action = self.after.pop(directory, None)
        if action is not None:
            action()


def plain_v1(root: Path) -> dict[str, set[str]]:
    """job id -> its dirs, from a walk of the tree of its own."""
    jobs: dict[str, set[str]] = {}
    for path in root.glob("*/slurm*/uid_*/job_*"):
        jobs.setdefault(path.name.removeprefix("job_"), set()).add(str(path))
    return jobs


def plain_v2(root: Path) -> dict[str, set[str]]:
    return {p.name.removeprefix("job_"): {str(p)}
            for p in root.glob("**/slurmstepd.scope/job_*")}


def found(jobs: dict[str, JobCgroup]) -> dict[str, set[str]]:
    return {key: {str(d) for dirs in (job.dirs, *job.more_dirs) for d in dirs.values()}
            for key, job in jobs.items()}


def watches_in_kernel(fd: int) -> int:
    """The watches the kernel holds on an inotify fd (its fdinfo, one line each)."""
    text = Path(f"/proc/self/fdinfo/{fd}").read_text()
    return sum(line.startswith("inotify wd:") for line in text.splitlines())


@pytest.fixture
def v1_tree(tmp_path: Path) -> Path:
    dest = tmp_path / "v1-slurm"
    shutil.copytree(LAYOUTS / "v1-slurm", dest)
    return dest


def test_unchanged_tree_is_listed_once(v1_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    count = Listings(monkeypatch)
    fs = CgroupFS(v1_tree, clock=Clock())
    roots = len(fs.slurm_roots())
    for _ in range(5):
        assert found(fs.find_jobs()) == plain_v1(v1_tree)
    assert roots > 1 and count.roots == roots


def test_job_made_and_removed_is_seen_at_the_next_call(
        v1_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    count = Listings(monkeypatch)
    fs = CgroupFS(v1_tree, clock=Clock())
    fs.find_jobs()
    (v1_tree / "memory/slurm/uid_1000/job_555").mkdir()
    assert "555" in found(fs.find_jobs()) and found(fs.find_jobs()) == plain_v1(v1_tree)
    (v1_tree / "memory/slurm/uid_1000/job_555").rmdir()
    assert found(fs.find_jobs()) == plain_v1(v1_tree) and "555" not in plain_v1(v1_tree)
    assert count.roots == 3 * len(fs.slurm_roots())  # first, made, removed


def test_job_in_a_new_uid_dir_is_seen(v1_tree: Path) -> None:
    fs = CgroupFS(v1_tree, clock=Clock())
    fs.find_jobs()
    (v1_tree / "freezer/slurm/uid_2000").mkdir()
    fs.find_jobs()  # the uid dir, still empty, is now listed and watched
    (v1_tree / "freezer/slurm/uid_2000/job_777").mkdir()
    assert found(fs.find_jobs())["777"] == {str(v1_tree / "freezer/slurm/uid_2000/job_777")}
    assert found(fs.find_jobs()) == plain_v1(v1_tree)


def test_change_inside_a_job_dir_lists_nothing(
        v1_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A job's subtree is never watched: a user who may make cgroups there cannot wake
    # the agent or make it hold watches.
    count = Listings(monkeypatch)
    fs = CgroupFS(v1_tree, clock=Clock())
    fs.find_jobs()
    listed = count.roots
    (v1_tree / "memory/slurm/uid_1000/job_101/step_9").mkdir()
    (v1_tree / "memory/slurm/uid_1000/job_101/step_9/task_0").mkdir()
    fs.find_jobs()
    assert count.roots == listed
    watched = [os.path.relpath(path, v1_tree) for path in fs._dir_watch.watched()]
    assert watched and all("job_" not in path for path in watched)


def test_full_listing_every_minute_and_a_change_it_saw_is_not_listed_again(
        v1_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    count = Listings(monkeypatch)
    clock = Clock()
    fs = CgroupFS(v1_tree, clock=clock)
    roots = len(fs.slurm_roots())
    fs.find_jobs()
    clock.now += 59.0
    fs.find_jobs()
    assert count.roots == roots
    clock.now += 1.0
    fs.find_jobs()  # nothing changed, but a minute passed
    assert count.roots == 2 * roots
    (v1_tree / "memory/slurm/uid_1000/job_556").mkdir()
    clock.now += 60.0
    assert found(fs.find_jobs()) == plain_v1(v1_tree)
    assert count.roots == 3 * roots
    fs.find_jobs()  # the mkdir's event was drained before that listing
    assert count.roots == 3 * roots


def test_uid_dir_made_while_its_root_is_listed_is_seen_next(
        v1_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The root is watched before it is listed: a child made between is queued.
    count = Listings(monkeypatch)
    clock = Clock()
    fs = CgroupFS(v1_tree, clock=clock)
    root = str(v1_tree / "memory/slurm")
    count.after[root] = lambda: os.makedirs(f"{root}/uid_3000/job_31")
    fs.find_jobs()
    assert "31" in plain_v1(v1_tree)
    assert found(fs.find_jobs()) == plain_v1(v1_tree)


def test_job_made_in_a_listed_dir_during_a_listing_is_seen_next(
        v1_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Events are drained before a listing, never after it: this one stays queued.
    count = Listings(monkeypatch)
    clock = Clock()
    fs = CgroupFS(v1_tree, clock=clock)
    fs.find_jobs()
    uid_dir = str(v1_tree / "cpuacct/slurm/uid_1000")
    (v1_tree / "memory/slurm/uid_1000/job_557").mkdir()  # forces the next listing
    count.after[uid_dir] = lambda: os.mkdir(f"{uid_dir}/job_32")
    fs.find_jobs()
    assert found(fs.find_jobs()) == plain_v1(v1_tree)
    assert "32" in plain_v1(v1_tree)


def test_uid_dir_listed_once_more_when_its_job_came_while_it_was_listed(
        v1_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A uid dir is watched before it is listed, as the root is.
    count = Listings(monkeypatch)
    fs = CgroupFS(v1_tree, clock=Clock())
    uid_dir = str(v1_tree / "devices/slurm/uid_1001")
    count.after[uid_dir] = lambda: os.mkdir(f"{uid_dir}/job_33")
    fs.find_jobs()
    assert found(fs.find_jobs()) == plain_v1(v1_tree) and "33" in plain_v1(v1_tree)


def test_v2_scope_is_watched_and_jobs_below_it_are_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "v2"
    shutil.copytree(LAYOUTS / "v2-system-slice", root)
    count = Listings(monkeypatch)
    fs = CgroupFS(root, clock=Clock())
    assert found(fs.find_jobs()) == plain_v2(root)
    scope = root / "system.slice/slurmstepd.scope"
    assert fs._dir_watch.watched() == [str(scope)]
    (scope / "job_401/step_7").mkdir()
    fs.find_jobs()
    assert count.roots == 1
    (scope / "job_402").rename(tmp_path / "gone")
    assert found(fs.find_jobs()) == plain_v2(root) and "402" not in plain_v2(root)
    assert count.roots == 2


def test_without_inotify_every_call_lists_and_says_so_once(
        v1_tree: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    def no_inotify() -> Inotify:
        raise OSError(errno.EMFILE, "Too many open files")

    count = Listings(monkeypatch)
    fs = CgroupFS(v1_tree, clock=Clock(), dir_watch=DirWatch(no_inotify))
    roots = len(fs.slurm_roots())
    with caplog.at_level(logging.INFO, logger="slurm_gpu_exporter"):
        for _ in range(3):
            assert found(fs.find_jobs()) == plain_v1(v1_tree)
    assert count.roots == 3 * roots
    told = [r for r in caplog.records if "inotify" in r.getMessage()]
    assert len(told) == 1 and told[0].levelno == logging.INFO


class Flaky(Inotify):
    """A real inotify fd whose add_watch fails for chosen paths, and whose read can
    report a queue overflow."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse: set[str] = set()
        self.overflow = False

    def add_watch(self, path: str, mask: int) -> int:
        if path in self.refuse:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().add_watch(path, mask)

    def read(self) -> list[tuple[int, int]]:
        if self.overflow:
            self.overflow = False
            return [(-1, IN_Q_OVERFLOW)]
        return super().read()


def test_a_watch_that_failed_or_a_queue_overflow_lists_again(
        v1_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    count = Listings(monkeypatch)
    fd = Flaky()
    fs = CgroupFS(v1_tree, clock=Clock(), dir_watch=DirWatch(lambda: fd))
    roots = len(fs.slurm_roots())
    fd.refuse = {str(v1_tree / "cpuset/slurm/uid_1000")}
    fs.find_jobs()
    fs.find_jobs()
    assert count.roots == 2 * roots
    fd.refuse = set()
    fs.find_jobs()  # watched now: the next call lists nothing
    fs.find_jobs()
    assert count.roots == 3 * roots
    fd.overflow = True
    fs.find_jobs()
    assert count.roots == 4 * roots


def test_a_root_whose_parent_moved_is_listed_within_a_minute_and_unwatched(
        tmp_path: Path) -> None:
    # No event tells of a parent renamed (cgroupfs refuses that rename: a test tree
    # only); the minute's listing finds the root gone, and its watch goes.
    root = tmp_path / "v2"
    shutil.copytree(LAYOUTS / "v2-custom-slice", root)
    clock = Clock()
    fs = CgroupFS(root, rescan_interval=3600.0, clock=clock)
    fs.find_jobs()
    inotify_fd = fs._dir_watch._fd
    assert isinstance(inotify_fd, Inotify) and inotify_fd.fd is not None
    (root / "slurm.slice").rename(root / "compute.slice")
    clock.now += 60.0
    assert fs.find_jobs() == {}
    assert found(fs.find_jobs()) == plain_v2(root)
    assert fs._dir_watch.watched() == [str(root / "compute.slice/slurmstepd.scope")]
    assert watches_in_kernel(inotify_fd.fd) == 1


def test_watches_follow_the_listed_dirs_and_close_drops_the_fd(v1_tree: Path) -> None:
    fs = CgroupFS(v1_tree, clock=Clock())
    fs.find_jobs()
    inotify_fd = fs._dir_watch._fd
    assert isinstance(inotify_fd, Inotify) and inotify_fd.fd is not None
    fd = inotify_fd.fd
    listed = {str(p) for p in v1_tree.glob("*/slurm*")} | {
        str(p) for p in v1_tree.glob("*/slurm*/uid_*")}
    assert set(fs._dir_watch.watched()) == listed
    for _ in range(3):  # a uid dir made and removed: no watch left behind
        (v1_tree / "memory/slurm/uid_4000").mkdir()
        fs.find_jobs()
        (v1_tree / "memory/slurm/uid_4000").rmdir()
        fs.find_jobs()
    fs.find_jobs()
    assert watches_in_kernel(fd) == len(listed)
    assert set(fs._dir_watch.watched()) == listed
    fs.close()
    link = Path(f"/proc/self/fd/{fd}")
    assert not link.exists() or os.readlink(link) != "anon_inode:inotify"


# --- real cgroupfs -------------------------------------------------------------------

CGROUP = Path("/sys/fs/cgroup")
# hierarchy -> a Slurm-shaped tree below the test's own top cgroup, read as a cgroup
# mount of its own (no agent on this machine takes it for a Slurm root).
REAL_TREES = {
    "memory": ("memory/slurm/uid_1000", "job_{}"),
    "unified": ("system.slice/slurmstepd.scope", "job_{}"),
}


@pytest.mark.process
@pytest.mark.parametrize("hierarchy", sorted(REAL_TREES))
def test_job_cgroup_made_on_cgroupfs_is_seen_at_the_next_call(
        hierarchy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    base = CGROUP / hierarchy
    require(os.geteuid() == 0, "making cgroups needs root")
    require((base / "cgroup.procs").exists(), f"no cgroup hierarchy mounted at {base}")
    top = base / f"sge-watch-{os.getpid()}"
    parent, job = REAL_TREES[hierarchy]
    made = [top / parent / job.format(1), top / parent / job.format(2)]
    try:
        made[0].mkdir(parents=True)
        count = Listings(monkeypatch)
        fs = CgroupFS(top, clock=Clock())
        assert set(fs.find_jobs()) == {"1"}
        assert set(fs.find_jobs()) == {"1"} and count.roots == 1  # nothing queued
        watched = fs._dir_watch.watched()
        made[1].mkdir()  # a real cgroup: its parent's mtime does not move
        assert set(fs.find_jobs()) == {"1", "2"} and count.roots == 2
        made[1].rmdir()
        assert set(fs.find_jobs()) == {"1"} and count.roots == 3
        assert fs._dir_watch.watched() == watched
        fs.close()
    finally:
        for leaf in made:
            for directory in [leaf, *leaf.parents]:
                if directory == base:
                    break
                with contextlib.suppress(OSError):  # gone already, or not empty
                    directory.rmdir()
