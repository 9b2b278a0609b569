"""Slurm job cgroups: path parsing, job discovery and stats on every layout."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from slurm_gpu_exporter.node.cgroup import CgroupFS, CgroupGone
from slurm_gpu_exporter.node.cgroup.files import UNIFIED, parse_cpu_list
from slurm_gpu_exporter.node.cgroup.paths import CgroupJobRef, parse_cgroup_path
from tests.support import FIXTURES, Clock, require

LAYOUTS = FIXTURES / "cgroup-layouts"
REAL = FIXTURES / "slurm-22.05"

GIB = 1 << 30


def layout_copy(tmp_path: Path, name: str) -> Path:
    """A writable copy of a checked-in layout, for tests that change the tree."""
    dest = tmp_path / name
    shutil.copytree(LAYOUTS / name, dest)
    return dest


# --- parse_cgroup_path ---------------------------------------------------------------


def test_v1_plain_path_maps_to_job_step_and_uid() -> None:
    ref = parse_cgroup_path("/slurm/uid_1000/job_1234/step_0/task_1")
    assert ref == CgroupJobRef(job_key="1234", step="0", uid=1000, is_sluid=False)


def test_v1_node_prefixed_path_maps_to_job_and_step() -> None:
    ref = parse_cgroup_path("/slurm_gpu-node07/uid_1001/job_77/step_batch")
    assert ref == CgroupJobRef(job_key="77", step="batch", uid=1001, is_sluid=False)


def test_v1_job_level_path_has_no_step() -> None:
    # Where proctrack/cgroup parks slurmstepd in the freezer tree.
    ref = parse_cgroup_path("/slurm/uid_0/job_5")
    assert ref == CgroupJobRef(job_key="5", step=None, uid=0, is_sluid=False)


def test_v2_default_scope_path_maps_to_job_and_step() -> None:
    ref = parse_cgroup_path("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0")
    assert ref == CgroupJobRef(job_key="4242", step="0", uid=None, is_sluid=False)


def test_v2_node_prefixed_scope_maps_to_job_and_step() -> None:
    path = "/system.slice/node01_slurmstepd.scope/job_9/step_extern/user/task_special"
    ref = parse_cgroup_path(path)
    assert ref == CgroupJobRef(job_key="9", step="extern", uid=None, is_sluid=False)


def test_v2_configured_slice_maps_to_job() -> None:
    ref = parse_cgroup_path("/slurm.slice/slurmstepd.scope/job_31/step_interactive/user/task_0")
    assert ref == CgroupJobRef(job_key="31", step="interactive", uid=None, is_sluid=False)


def test_v2_nested_slice_maps_to_job() -> None:
    ref = parse_cgroup_path("/gpu.slice/gpu-jobs.slice/slurmstepd.scope/job_31/step_0/user/task_0")
    assert ref is not None and ref.job_key == "31"


def test_v2_sluid_job_dir_maps_to_sluid_key() -> None:
    ref = parse_cgroup_path("/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0")
    assert ref == CgroupJobRef(job_key="sEKNKTV3WPV500", step="0", uid=None, is_sluid=True)


def test_v2_stepd_leaf_belongs_to_its_step() -> None:
    ref = parse_cgroup_path("/system.slice/slurmstepd.scope/job_8/step_batch/slurm")
    assert ref is not None and (ref.job_key, ref.step) == ("8", "batch")


@pytest.mark.parametrize(
    ("dirname", "step"),
    [
        ("step_0", "0"),
        ("step_17", "17"),
        ("step_batch", "batch"),
        ("step_extern", "extern"),
        ("step_interactive", "interactive"),
        ("step_0+1", "0+1"),
        ("step_3+12", "3+12"),
    ],
)
def test_every_step_name_is_recognised(dirname: str, step: str) -> None:
    for path in (
        f"/slurm/uid_1000/job_1/{dirname}/task_0",
        f"/system.slice/slurmstepd.scope/job_1/{dirname}/user/task_0",
    ):
        ref = parse_cgroup_path(path)
        assert ref is not None and ref.step == step, path


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "",
        "/system.slice/slurmd.service",
        "/system.slice/slurmstepd.scope",
        "/system.slice/slurmstepd.scope/system",  # slurmstepd's helper, not a job
        "/slurm/system",  # v1 specialised cores
        "/slurm/uid_1000",
        "/user.slice/user-1000.slice/session-3.scope",
        "/slurm_vm/vm1",
    ],
)
def test_non_job_cgroups_are_not_jobs(path: str) -> None:
    assert parse_cgroup_path(path) is None


@pytest.mark.parametrize(
    "path",
    [
        "/slurm/uid_1000/job_12abc/step_0",
        "/slurm/uid_1000/job_/step_0",
        "/slurm/uid_1000/job_012/step_0",  # Slurm never zero-pads ids
        "/slurm/uid_1000/job_-1",
        "/slurm/uid_1000/job_0",
        "/slurm/uid_x/job_1",
        "/slurm/job_1/step_0",
        "/slurm/uid_1000/job_1/step_foo",
        "/slurm/uid_1000/job_1/step_1+",
        "/slurm/uid_1000/job_1/step_+1",
        "/slurm/uid_1000/job_1/step_",
        "/slurm/uid_1000/job_1/task_0",
        "/slurmx/uid_1000/job_1",
        "/slurm_/uid_1000/job_1",
        "/slurm/uid_1000/../uid_1000/job_1",
        "/slurm/uid_1000/job_1/../../uid_1/job_2",
        "/slurm/./uid_1000/job_1",
        "/system.slice/slurmstepd.scope/job_1x/step_0",
        "/system.slice/slurmstepd.scope/1234/step_0",
        "/system.slice/slurmstepd.scope/seknktv3wpv500/step_0",  # not canonical (lower case)
        "/system.slice/slurmstepd.scope/sEKNKTV3WPV50/step_0",  # 12 digits
        "/system.slice/slurmstepd.scope/sEKNKTV3WPV5000/step_0",  # 14 digits
        "/system.slice/slurmstepd.scope/sEKNKTV3WPVU00/step_0",  # U is no base32 digit
        "/system.slice/slurmstepd.scope/SEKNKTV3WPV500/step_0",
        "/system.slice/xslurmstepd.scope/job_1",
        "/system.slice/_slurmstepd.scope/job_1",
        "/system.slice/slurmstepd.scope.bak/job_1",
        "/system.slice/slurmstepd.service/job_1",
    ],
)
def test_look_alikes_are_rejected(path: str) -> None:
    assert parse_cgroup_path(path) is None


def test_tree_below_a_namespace_prefix_is_still_recognised() -> None:
    # With a cgroup namespace or a nested container the Slurm tree sits deeper.
    ref = parse_cgroup_path("/kubepods/pod1/slurm/uid_1000/job_3/step_0")
    assert ref is not None and ref.job_key == "3"


def test_cpu_list_ranges_and_singles_are_counted() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == frozenset({0, 1, 2, 3, 8, 10, 11})
    assert parse_cpu_list("5") == frozenset({5})
    assert parse_cpu_list("\n") == frozenset()


@pytest.mark.parametrize("text", ["3-1", "a-b", "1-", "-1"])
def test_malformed_cpu_list_raises(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpu_list(text)


# --- version ---------------------------------------------------------------------------


def test_unified_mount_is_version_2() -> None:
    assert CgroupFS(LAYOUTS / "v2-system-slice").version() == 2


def test_per_controller_mounts_are_version_1() -> None:
    assert CgroupFS(LAYOUTS / "v1-slurm").version() == 1


def test_hybrid_mount_is_version_1_and_finds_v1_jobs(tmp_path: Path) -> None:
    root = layout_copy(tmp_path, "v1-slurm")
    (root / "unified").mkdir()
    (root / "unified" / "cgroup.controllers").write_text("\n")
    fs = CgroupFS(root)
    assert fs.version() == 1
    assert set(fs.find_jobs()) == {"101", "102"}


# --- find_jobs on each layout ----------------------------------------------------------


def test_v1_plain_layout_finds_jobs_in_every_controller() -> None:
    jobs = CgroupFS(LAYOUTS / "v1-slurm").find_jobs()
    assert set(jobs) == {"101", "102"}
    job = jobs["101"]
    assert (job.version, job.uid, job.is_sluid) == (1, 1000, False)
    assert set(job.dirs) == {"cpuacct", "cpuset", "devices", "freezer", "memory"}
    assert job.dirs["memory"] == LAYOUTS / "v1-slurm/memory/slurm/uid_1000/job_101"
    assert jobs["102"].uid == 1001
    assert jobs["101"].more_dirs == ()


def test_v1_tool_tree_named_like_slurm_is_ignored() -> None:
    jobs = CgroupFS(LAYOUTS / "v1-slurm").find_jobs()
    assert all("slurm_vm" not in str(p) for j in jobs.values() for p in j.dirs.values())


def test_v1_node_prefixed_layout_finds_job_without_cpuacct() -> None:
    jobs = CgroupFS(LAYOUTS / "v1-node-prefix").find_jobs()
    assert set(jobs) == {"301"}
    assert "cpuacct" not in jobs["301"].dirs
    assert jobs["301"].dirs["freezer"].parts[-3:] == ("slurm_node01", "uid_1000", "job_301")


def test_v1_combined_cpu_cpuacct_mount_is_read_once(tmp_path: Path) -> None:
    # Many distributions mount cpu and cpuacct together and symlink both names to it.
    root = layout_copy(tmp_path, "v1-slurm")
    shutil.rmtree(root / "cpu")
    (root / "cpuacct").rename(root / "cpu,cpuacct")
    os.symlink("cpu,cpuacct", root / "cpu")
    os.symlink("cpu,cpuacct", root / "cpuacct")
    fs = CgroupFS(root)
    job = fs.find_jobs()["101"]
    assert job.dirs["cpuacct"] == root / "cpu,cpuacct/slurm/uid_1000/job_101"
    assert job.dirs["cpu"] == job.dirs["cpuacct"]
    assert job.more_dirs == ()
    assert fs.read_stats(job).cpu_seconds == pytest.approx(123.456789012)


@pytest.mark.parametrize(
    ("layout", "keys", "scope"),
    [
        ("v2-system-slice", {"401", "402"}, "system.slice/slurmstepd.scope"),
        ("v2-node-scope", {"501"}, "system.slice/node01_slurmstepd.scope"),
        ("v2-custom-slice", {"601"}, "slurm.slice/slurmstepd.scope"),
    ],
)
def test_v2_layouts_find_jobs_under_the_stepd_scope(
    layout: str, keys: set[str], scope: str
) -> None:
    jobs = CgroupFS(LAYOUTS / layout).find_jobs()
    assert set(jobs) == keys
    for key, job in jobs.items():
        assert (job.version, job.uid, job.is_sluid) == (2, None, False)
        assert dict(job.dirs) == {UNIFIED: LAYOUTS / layout / scope / f"job_{key}"}


def test_v2_sluid_layout_keys_jobs_by_sluid() -> None:
    jobs = CgroupFS(LAYOUTS / "v2-sluid").find_jobs()
    assert set(jobs) == {"sEKNKTV3WPV500", "s0C2W8GZ1J9T04"}
    assert all(job.is_sluid for job in jobs.values())


def test_v2_multi_slurmd_finds_jobs_of_every_scope() -> None:
    jobs = CgroupFS(LAYOUTS / "v2-multi-slurmd").find_jobs()
    assert set(jobs) == {"701", "702", "703"}
    scopes = {job.dirs[UNIFIED].parent.name for job in jobs.values()}
    assert scopes == {"node01_slurmstepd.scope", "node02_slurmstepd.scope"}
    # Job 703 spans two emulated nodes of this host: both directories are kept.
    job = jobs["703"]
    assert job.dirs[UNIFIED].parent.name == "node02_slurmstepd.scope"
    assert [d[UNIFIED].parent.name for d in job.more_dirs] == ["node03_slurmstepd.scope"]


def test_v2_nested_slice_is_searched(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    job = root / "gpu.slice" / "gpu-jobs.slice" / "slurmstepd.scope" / "job_9"
    job.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    assert set(CgroupFS(root).find_jobs()) == {"9"}


def test_node_without_slurm_cgroups_has_no_jobs(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    (root / "system.slice" / "sshd.service").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    fs = CgroupFS(root)
    assert fs.find_jobs() == {}
    assert fs.slurm_roots() == ()
    assert CgroupFS(tmp_path / "missing").find_jobs() == {}


def test_scope_that_appears_with_a_new_job_is_read_from_the_next_call_on(
    tmp_path: Path,
) -> None:
    # A second stepd scope (another CgroupSlice, another slurmd) appears after the
    # agent started: its jobs are found at once, not after rescan_interval.
    now = [0.0]
    root = layout_copy(tmp_path, "v2-system-slice")
    fs = CgroupFS(root, rescan_interval=60.0, clock=lambda: now[0])
    assert set(fs.find_jobs()) == {"401", "402"}
    assert "/other.slice/slurmstepd.scope" not in {r.path for r in fs.proc_roots()}
    now[0] = 30.0  # the jobs above are no longer new
    (root / "other.slice/slurmstepd.scope/job_900").mkdir(parents=True)
    assert set(fs.find_jobs(expected=["900"])) == {"401", "402", "900"}
    assert Path(root / "other.slice/slurmstepd.scope") in fs.slurm_roots()
    # Where a process's cgroup names its job follows the new root at once.
    assert "/other.slice/slurmstepd.scope" in {r.path for r in fs.proc_roots()}


def test_v1_root_made_at_the_first_job_is_read_from_the_next_call_on(tmp_path: Path) -> None:
    # slurmd makes slurm_<node> in cpuset and devices only at the first job after it
    # starts: that job's CPUs must be read from the next sample, not a minute later.
    now = [0.0]
    root = layout_copy(tmp_path, "v1-slurm")
    late = root / "cpuset" / "slurm"
    moved = tmp_path / "cpuset-slurm"
    late.rename(moved)
    fs = CgroupFS(root, rescan_interval=60.0, clock=lambda: now[0])
    job = fs.find_jobs()["101"]
    assert "cpuset" not in job.dirs and fs.read_stats(job).cpus is None
    assert not any("cpuset" in r.controllers for r in fs.proc_roots())
    now[0] = 1.0
    moved.rename(late)
    job = fs.find_jobs()["101"]
    assert job.dirs["cpuset"] == late / "uid_1000" / "job_101"
    assert fs.read_stats(job).cpus == 5  # 0-3,8
    assert any("cpuset" in r.controllers and r.path == "/slurm" for r in fs.proc_roots())


def test_roots_are_not_searched_again_while_no_job_is_new(tmp_path: Path) -> None:
    # Searching for roots costs a walk of the systemd slices: once every job is
    # older than the new-job window, only rescan_interval brings a new search.
    now = [0.0]
    root = layout_copy(tmp_path, "v2-system-slice")
    fs = CgroupFS(root, rescan_interval=60.0, clock=lambda: now[0])
    assert set(fs.find_jobs()) == {"401", "402"}
    now[0] = 30.0
    (root / "other.slice/slurmstepd.scope/job_900").mkdir(parents=True)
    assert set(fs.find_jobs()) == {"401", "402"}  # nothing new is expected
    now[0] = 61.0
    assert set(fs.find_jobs()) == {"401", "402", "900"}


def test_vanished_root_triggers_a_new_search(tmp_path: Path) -> None:
    root = layout_copy(tmp_path, "v2-custom-slice")
    fs = CgroupFS(root, rescan_interval=3600.0, clock=lambda: 0.0)
    assert set(fs.find_jobs()) == {"601"}
    # slurmd restarted with another CgroupSlice: the old scope is gone. (Made anew and
    # removed, not renamed: cgroup v2 refuses a rename, and a watch on the scope
    # would follow a renamed parent without an event.)
    shutil.copytree(root / "slurm.slice", root / "compute.slice")
    shutil.rmtree(root / "slurm.slice")
    assert fs.find_jobs() == {}
    assert set(fs.find_jobs()) == {"601"}


# --- read_stats ------------------------------------------------------------------------


def test_v1_stats_with_cpuacct() -> None:
    fs = CgroupFS(LAYOUTS / "v1-slurm")
    stats = fs.read_stats(fs.find_jobs()["101"])
    assert stats.cpu_seconds == pytest.approx(123.456789012)
    assert stats.cpus == 5  # 0-3,8
    assert stats.memory_used_bytes == 734_003_200 - 209_715_200  # minus inactive file cache
    assert stats.memory_limit_bytes == 2 * GIB
    assert stats.memory_peak_bytes == 900_000_000
    assert stats.oom_kills == 1
    # The job-level freezer cgroup holds slurmstepd (5001-5003): not the job's.
    assert stats.pids == (5010, 5011, 5020, 5021)


def test_v1_stats_without_cpuacct_leave_cpu_to_the_caller() -> None:
    fs = CgroupFS(LAYOUTS / "v1-node-prefix")
    stats = fs.read_stats(fs.find_jobs()["301"])
    assert stats.cpu_seconds is None
    assert stats.cpus == 2
    assert stats.memory_used_bytes == 52_428_800 - 1_048_576
    assert stats.memory_limit_bytes == GIB
    assert stats.pids == (6010, 6011, 6012)


def test_v1_unlimited_memory_limit_is_none() -> None:
    fs = CgroupFS(LAYOUTS / "v1-slurm")
    stats = fs.read_stats(fs.find_jobs()["102"])
    assert stats.memory_limit_bytes is None
    assert stats.memory_used_bytes == 104_857_600
    assert stats.pids == (5110,)


def test_v2_stats() -> None:
    fs = CgroupFS(LAYOUTS / "v2-system-slice")
    stats = fs.read_stats(fs.find_jobs()["401"])
    assert stats.cpu_seconds == pytest.approx(98.765432)
    assert stats.cpus == 7  # 0-3,8,10-11
    assert stats.memory_used_bytes == 1_073_741_824 - 268_435_456
    assert stats.memory_limit_bytes == 4 * GIB
    assert stats.memory_peak_bytes == 1_610_612_736
    assert stats.oom_kills == 2
    # step_*/slurm holds slurmstepd (7001-7003): not the job's.
    assert stats.pids == (7010, 7011, 7012, 7020, 7021)


def test_v2_unlimited_memory_and_missing_peak_are_none() -> None:
    fs = CgroupFS(LAYOUTS / "v2-system-slice")
    stats = fs.read_stats(fs.find_jobs()["402"])
    assert stats.memory_limit_bytes is None
    assert stats.memory_peak_bytes is None
    assert stats.memory_used_bytes is not None
    assert stats.pids == (7110,)


@pytest.mark.parametrize("layout", ["v2-node-scope", "v2-custom-slice", "v2-sluid"])
def test_v2_stats_on_every_layout(layout: str) -> None:
    fs = CgroupFS(LAYOUTS / layout)
    for job in fs.find_jobs().values():
        stats = fs.read_stats(job)
        assert stats.cpu_seconds == pytest.approx(98.765432)
        assert stats.pids


def test_v2_job_on_two_slurmd_instances_adds_up() -> None:
    fs = CgroupFS(LAYOUTS / "v2-multi-slurmd")
    stats = fs.read_stats(fs.find_jobs()["703"])
    assert stats.cpu_seconds == pytest.approx(2 * 98.765432)
    assert stats.cpus == 4  # 0-1 on node02, 2-3 on node03
    assert stats.memory_limit_bytes == 8 * GIB
    assert stats.pids == (8210, 8310)


def test_job_dir_that_vanishes_between_find_and_read_raises_cgroup_gone(tmp_path: Path) -> None:
    root = layout_copy(tmp_path, "v2-system-slice")
    fs = CgroupFS(root)
    job = fs.find_jobs()["401"]
    shutil.rmtree(job.dirs[UNIFIED])
    with pytest.raises(CgroupGone):
        fs.read_stats(job)


def test_v1_job_that_vanishes_from_every_controller_raises_cgroup_gone(tmp_path: Path) -> None:
    root = layout_copy(tmp_path, "v1-slurm")
    fs = CgroupFS(root)
    job = fs.find_jobs()["101"]
    for path in job.dirs.values():
        shutil.rmtree(path)
    with pytest.raises(CgroupGone):
        fs.read_stats(job)


def test_one_odd_file_leaves_only_its_field_empty(tmp_path: Path) -> None:
    root = layout_copy(tmp_path, "v2-system-slice")
    fs = CgroupFS(root)
    job = fs.find_jobs()["401"]
    job_dir = job.dirs[UNIFIED]
    (job_dir / "cpu.stat").unlink()
    (job_dir / "memory.max").write_text("garbage\n")
    (job_dir / "cpuset.cpus.effective").write_text("3-1\n")
    stats = fs.read_stats(job)
    assert stats.cpu_seconds is None
    assert stats.memory_limit_bytes is None
    assert stats.cpus is None
    assert stats.memory_used_bytes == 1_073_741_824 - 268_435_456
    assert stats.oom_kills == 2


def test_v1_pids_without_freezer_come_from_task_cgroups_without_slurmstepd(
    tmp_path: Path,
) -> None:
    # proctrack/linuxproc: no freezer tree; memory and devices hold slurmstepd at the
    # step level and the tasks in task_<n>.
    root = layout_copy(tmp_path, "v1-slurm")
    shutil.rmtree(root / "freezer" / "slurm")
    fs = CgroupFS(root)
    assert fs.read_stats(fs.find_jobs()["101"]).pids == (5010, 5011, 5020, 5021)
    shutil.rmtree(root / "cpuacct" / "slurm")
    fs = CgroupFS(root)
    assert fs.read_stats(fs.find_jobs()["101"]).pids == (5010, 5011, 5020, 5021)


def _set_descendants(job_dir: Path) -> None:
    """Write cgroup.stat as the kernel would for the job's current subtree."""
    count = sum(1 for p in job_dir.rglob("*") if p.is_dir())
    (job_dir / "cgroup.stat").write_text(f"nr_descendants {count}\nnr_dying_descendants 0\n")


def test_v2_new_step_is_seen_when_the_subtree_grows(tmp_path: Path) -> None:
    root = layout_copy(tmp_path, "v2-system-slice")
    fs = CgroupFS(root)
    job = fs.find_jobs()["401"]
    assert fs.read_stats(job).pids == (7010, 7011, 7012, 7020, 7021)
    task = job.dirs[UNIFIED] / "step_1" / "user" / "task_0"
    task.mkdir(parents=True)
    (task / "cgroup.procs").write_text("7030\n")
    (job.dirs[UNIFIED] / "step_1" / "slurm").mkdir()
    (job.dirs[UNIFIED] / "step_1" / "slurm" / "cgroup.procs").write_text("7004\n")
    _set_descendants(job.dirs[UNIFIED])
    assert fs.read_stats(job).pids == (7010, 7011, 7012, 7020, 7021, 7030)


def test_v2_step_replaced_by_another_of_the_same_size_is_seen(tmp_path: Path) -> None:
    # The descendant count alone cannot tell; the vanished leaf forces a fresh walk.
    root = layout_copy(tmp_path, "v2-system-slice")
    fs = CgroupFS(root)
    job = fs.find_jobs()["402"]
    assert fs.read_stats(job).pids == (7110,)
    old = job.dirs[UNIFIED] / "step_0+1"
    old.rename(job.dirs[UNIFIED] / "step_1")
    (job.dirs[UNIFIED] / "step_1" / "user" / "task_0" / "cgroup.procs").write_text("7120\n")
    assert fs.read_stats(job).pids == (7120,)


def test_v2_job_without_cgroup_stat_is_walked_every_time(tmp_path: Path) -> None:
    root = layout_copy(tmp_path, "v2-system-slice")
    fs = CgroupFS(root)
    job = fs.find_jobs()["402"]
    (job.dirs[UNIFIED] / "cgroup.stat").unlink()
    assert fs.read_stats(job).pids == (7110,)
    task = job.dirs[UNIFIED] / "step_0+1" / "user" / "task_1"
    task.mkdir()
    (task / "cgroup.procs").write_text("7111\n")
    assert fs.read_stats(job).pids == (7110, 7111)


def test_step_that_ends_during_the_walk_is_skipped(tmp_path: Path) -> None:
    root = layout_copy(tmp_path, "v1-slurm")
    fs = CgroupFS(root)
    job = fs.find_jobs()["101"]
    shutil.rmtree(job.dirs["freezer"] / "step_0")
    assert fs.read_stats(job).pids == (5010, 5011)


# --- the real tree captured from Slurm 22.05 (cgroup v1) ----------------------------------


def _real_capture() -> tuple[Path, str]:
    require(
        (REAL / "cgroup").is_dir() and (REAL / "capture.txt").is_file(),
        "no captured Slurm 22.05 tree in tests/fixtures/slurm-22.05",
    )
    m = re.search(r"^job: (\d+)$", (REAL / "capture.txt").read_text(), re.MULTILINE)
    assert m, "capture.txt names the job"
    return REAL / "cgroup", m.group(1)


def test_real_v1_tree_is_found_with_node_prefix_and_uid() -> None:
    root, job_id = _real_capture()
    fs = CgroupFS(root)
    assert fs.version() == 1
    jobs = fs.find_jobs()
    assert set(jobs) == {job_id}
    job = jobs[job_id]
    assert job.uid is not None and job.uid > 0
    assert "freezer" in job.dirs and "memory" in job.dirs
    for path in job.dirs.values():
        assert parse_cgroup_path("/" + str(path.relative_to(root)).split("/", 1)[1]) == (
            CgroupJobRef(job_key=job_id, step=None, uid=job.uid, is_sluid=False)
        )


def test_real_v1_step_dirs_all_parse_to_the_job() -> None:
    root, job_id = _real_capture()
    steps = set()
    for dirpath, _, _ in os.walk(root):
        rel = Path(dirpath).relative_to(root).parts[1:]  # drop the controller
        if len(rel) >= 4:  # slurm_<node>/uid_<uid>/job_<id>/step_<s>...
            ref = parse_cgroup_path("/" + "/".join(rel))
            assert ref is not None and ref.job_key == job_id, dirpath
            assert ref.step is not None
            steps.add(ref.step)
    assert {"batch", "extern", "0"} <= steps, steps


def test_real_v1_stats_are_read() -> None:
    root, job_id = _real_capture()
    fs = CgroupFS(root)
    job = fs.find_jobs()[job_id]
    stats = fs.read_stats(job)
    memory = job.dirs["memory"]
    usage = int((memory / "memory.usage_in_bytes").read_text())
    assert 0 < stats.memory_used_bytes <= usage  # type: ignore[operator]
    assert stats.memory_limit_bytes == int((memory / "memory.limit_in_bytes").read_text())
    assert stats.memory_peak_bytes == int((memory / "memory.max_usage_in_bytes").read_text())
    assert stats.oom_kills == 0
    assert stats.cpus is not None and stats.cpus >= 1
    # cpuacct job cgroups exist exactly when JobAcctGatherType=jobacct_gather/cgroup.
    assert ("cpuacct" in job.dirs) == (stats.cpu_seconds is not None)
    if stats.cpu_seconds is not None:
        assert stats.cpu_seconds >= 2.0  # the captured workload burnt 2 s of CPU


def test_real_v1_pids_are_the_jobs_processes_without_slurmstepd() -> None:
    root, job_id = _real_capture()
    fs = CgroupFS(root)
    stats = fs.read_stats(fs.find_jobs()[job_id])
    procs = REAL / "proc"
    comm = {
        int(p.name): (p / "stat").read_text().split("(", 1)[1].rsplit(")", 1)[0]
        for p in procs.iterdir()
    }
    assert set(stats.pids) == {pid for pid, name in comm.items() if name != "slurmstepd"}


# --- what a sample reads ---------------------------------------------------------------


def _opened_files(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: str, *args: int, **kwargs: int) -> int:
        opened.append(os.path.basename(os.fspath(path)))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    return opened


@pytest.mark.parametrize(("layout", "job_key", "steady"), [
    ("v1-slurm", "101", {"cpuset.effective_cpus", "cpuset.cpus", "memory.limit_in_bytes"}),
    ("v2-system-slice", "401", {"cpuset.cpus.effective", "memory.max"}),
])
def test_a_jobs_cpuset_and_memory_limit_are_read_again_only_after_the_steady_ttl(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str, job_key: str,
        steady: set[str]) -> None:
    clock = Clock()
    fs = CgroupFS(layout_copy(tmp_path, layout), steady_ttl=60.0, clock=clock)
    job = fs.find_jobs()[job_key]
    first = fs.read_stats(job)
    opened = _opened_files(monkeypatch)
    clock.now += 30
    assert fs.read_stats(job) == first
    assert not steady & set(opened)
    assert {"memory.stat", "cgroup.procs"} <= set(opened)  # what moves is read every time
    opened.clear()
    clock.now += 31
    assert fs.read_stats(job) == first
    assert steady & set(opened)


@pytest.mark.parametrize(("layout", "job_key", "limit_file", "unlimited"), [
    ("v1-slurm", "101", "memory.limit_in_bytes", "9223372036854771712"),
    ("v2-system-slice", "401", "memory.max", "max"),
])
def test_no_memory_limit_is_steady_too_and_read_again_only_after_the_ttl(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str, job_key: str,
        limit_file: str, unlimited: str) -> None:
    # A job without a memory limit (no ConstrainRAMSpace) is as steady as one with.
    clock = Clock()
    fs = CgroupFS(layout_copy(tmp_path, layout), steady_ttl=60.0, clock=clock)
    job = fs.find_jobs()[job_key]
    memory_dir = job.dirs["memory" if "memory" in job.dirs else UNIFIED]
    (memory_dir / limit_file).write_text(unlimited + "\n")
    assert fs.read_stats(job).memory_limit_bytes is None
    opened = _opened_files(monkeypatch)
    clock.now += 30
    assert fs.read_stats(job).memory_limit_bytes is None
    assert limit_file not in opened
    clock.now += 31
    (memory_dir / limit_file).write_text(f"{2 * GIB}\n")  # an admin set one meanwhile
    assert fs.read_stats(job).memory_limit_bytes == 2 * GIB
    assert limit_file in opened


def test_a_changed_memory_limit_shows_once_the_steady_ttl_has_passed(tmp_path: Path) -> None:
    clock = Clock()
    root = layout_copy(tmp_path, "v2-system-slice")
    fs = CgroupFS(root, steady_ttl=60.0, clock=clock)
    job = fs.find_jobs()["401"]
    before = fs.read_stats(job).memory_limit_bytes
    (job.dirs[UNIFIED] / "memory.max").write_text(f"{3 * GIB}\n")
    clock.now += 59
    assert fs.read_stats(job).memory_limit_bytes == before
    clock.now += 2
    assert fs.read_stats(job).memory_limit_bytes == 3 * GIB


def test_each_cgroup_file_is_read_with_one_read_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fs = CgroupFS(layout_copy(tmp_path, "v1-slurm"))
    job = fs.find_jobs()["101"]
    fs.read_stats(job)
    opens, reads = [0], [0]
    real_open, real_read = os.open, os.read

    def counting_open(*args: object, **kwargs: object) -> int:
        opens[0] += 1
        return real_open(*args, **kwargs)  # type: ignore[arg-type]

    def counting_read(*args: object, **kwargs: object) -> bytes:
        reads[0] += 1
        return real_read(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", counting_open)
    monkeypatch.setattr(os, "read", counting_read)
    fs.read_stats(job)
    assert opens[0] > 0 and reads[0] == opens[0]


def _scanned_dirs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The directories listed from now on (by os.scandir or os.listdir), by name."""
    scanned: list[str] = []
    real_scandir, real_listdir = os.scandir, os.listdir

    def counting_scandir(path: str) -> object:
        scanned.append(os.path.basename(os.fspath(path)))
        return real_scandir(path)

    def counting_listdir(path: str) -> list[str]:
        scanned.append(os.path.basename(os.fspath(path)))
        return real_listdir(path)

    monkeypatch.setattr(os, "scandir", counting_scandir)
    monkeypatch.setattr(os, "listdir", counting_listdir)
    return scanned


def test_v1_steps_are_not_walked_again_once_they_are_no_longer_young(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    fs = CgroupFS(layout_copy(tmp_path, "v1-slurm"), clock=clock)
    job = fs.find_jobs()["101"]
    first = fs.read_stats(job).pids
    scanned = _scanned_dirs(monkeypatch)
    clock.now += 5  # young: the task cgroups may still be coming
    assert fs.read_stats(job).pids == first
    assert "step_0" in scanned
    scanned.clear()
    clock.now += 30
    assert fs.read_stats(job).pids == first
    scanned.clear()
    clock.now += 10
    assert fs.read_stats(job).pids == first
    # Neither listed (the job directory's link count is as it was) nor walked.
    assert scanned == []


def test_v1_a_step_that_came_as_another_went_is_seen_in_the_same_sample(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job directory's link count stays the same when one step goes and another
    comes between two samples; the gone step's failed read has the steps listed again."""
    clock = Clock()
    fs = CgroupFS(layout_copy(tmp_path, "v1-slurm"), clock=clock)
    job = fs.find_jobs()["101"]
    freezer = job.dirs["freezer"]
    before = set(fs.read_stats(job).pids)
    clock.now += 40
    assert set(fs.read_stats(job).pids) == before
    links = os.stat(freezer).st_nlink
    step0 = {int(p) for p in (freezer / "step_0" / "cgroup.procs").read_text().split()}
    shutil.rmtree(freezer / "step_0")
    (freezer / "step_1").mkdir()
    (freezer / "step_1" / "cgroup.procs").write_text("7001\n")
    assert os.stat(freezer).st_nlink == links
    scanned = _scanned_dirs(monkeypatch)
    clock.now += 1
    assert set(fs.read_stats(job).pids) == (before - step0) | {7001}
    assert scanned.count("job_101") == 1
    scanned.clear()
    clock.now += 1
    assert set(fs.read_stats(job).pids) == (before - step0) | {7001}
    assert "job_101" not in scanned


def test_v1_steps_are_listed_every_sample_where_link_counts_do_not_count_subdirs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A filesystem whose directories keep one link whatever they hold (btrfs): the link
    count says nothing, so the steps are listed each time and a new step is seen."""
    clock = Clock()
    fs = CgroupFS(layout_copy(tmp_path, "v1-slurm"), clock=clock)
    job = fs.find_jobs()["101"]
    freezer = job.dirs["freezer"]
    real_stat = os.stat

    def one_link(path: object, *args: object, **kwargs: object) -> os.stat_result:
        st = real_stat(path, *args, **kwargs)  # type: ignore[arg-type]
        return os.stat_result((st.st_mode, st.st_ino, st.st_dev, 1, *tuple(st)[4:]))

    monkeypatch.setattr(os, "stat", one_link)
    before = set(fs.read_stats(job).pids)
    clock.now += 40
    scanned = _scanned_dirs(monkeypatch)
    assert set(fs.read_stats(job).pids) == before
    assert scanned == ["job_101"]
    (freezer / "step_1").mkdir()
    (freezer / "step_1" / "cgroup.procs").write_text("7001\n")
    clock.now += 1
    assert set(fs.read_stats(job).pids) == before | {7001}


def test_v1_a_new_step_a_vanished_leaf_and_a_late_task_cgroup_are_all_seen(
        tmp_path: Path) -> None:
    clock = Clock()
    root = layout_copy(tmp_path, "v1-slurm")
    fs = CgroupFS(root, clock=clock)
    job = fs.find_jobs()["101"]
    freezer = job.dirs["freezer"]
    before = set(fs.read_stats(job).pids)
    clock.now += 40
    assert set(fs.read_stats(job).pids) == before  # now remembered
    # A new step shows at once.
    (freezer / "step_1").mkdir()
    (freezer / "step_1" / "cgroup.procs").write_text("7001\n")
    clock.now += 1
    assert set(fs.read_stats(job).pids) == before | {7001}
    # A remembered leaf that vanished (the step ended) is dropped at once.
    shutil.rmtree(freezer / "step_0")
    step0 = {int(p) for p in (LAYOUTS / "v1-slurm/freezer/slurm/uid_1000/job_101/step_0/"
                              "cgroup.procs").read_text().split()}
    clock.now += 1
    assert set(fs.read_stats(job).pids) == (before - step0) | {7001}
    # A task cgroup made under an old step, its processes moved into it: seen at the
    # next walk, within a minute.
    clock.now += 40
    fs.read_stats(job)
    task = freezer / "step_batch" / "task_0"
    task.mkdir()
    (task / "cgroup.procs").write_text("7002\n")
    (freezer / "step_batch" / "cgroup.procs").write_text("")
    clock.now += 61
    assert 7002 in fs.read_stats(job).pids


def test_an_unchanged_job_keeps_its_job_cgroup_and_one_in_a_new_tree_gets_a_new_one(
        tmp_path: Path) -> None:
    root = layout_copy(tmp_path, "v1-slurm")
    fs = CgroupFS(root)
    first = fs.find_jobs()["101"]
    assert fs.find_jobs()["101"] is first
    assert "blkio" not in first.dirs
    job_dir = root / "blkio" / "slurm" / "uid_1000" / "job_101"
    job_dir.mkdir(parents=True)
    fs = CgroupFS(root)  # blkio's Slurm tree is one of its roots now
    fs.find_jobs()
    shutil.rmtree(job_dir)
    before = fs.find_jobs()["101"]
    job_dir.mkdir(parents=True)  # the job appears in one more controller's tree
    after = fs.find_jobs()["101"]
    assert after is not before and after.dirs["blkio"] == job_dir
    assert fs.find_jobs()["101"] is after
