"""The job tracker reconciles spool records, cgroups and Slurm metadata into the job list."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from slurm_gpu_exporter.hooks import spool
from slurm_gpu_exporter.jobs.tracker import JobTracker
from slurm_gpu_exporter.node.cgroup import CgroupFS
from slurm_gpu_exporter.node.slurm.lookup import JobLookup, SlurmJobInfo, SlurmMetadata
from slurm_gpu_exporter.node.source_health import SourceErrors
from slurm_gpu_exporter.training_relay import TrainingRelay
from tests.support import Clock


class Node:
    """A synthetic cgroup v1 node plus its spool, built in a temporary directory."""

    def __init__(self, root: Path) -> None:
        self.cgroup_root = root / "cgroup"
        self.spool_dir = root / "spool"
        self.spool_dir.mkdir()
        for ctrl in ("memory", "freezer"):
            (self.cgroup_root / ctrl / "slurm_node1").mkdir(parents=True)

    def start_cgroup(self, jobid: str, uid: int = 1001) -> None:
        for ctrl in ("memory", "freezer"):
            task = self.cgroup_root / ctrl / "slurm_node1" / f"uid_{uid}" / f"job_{jobid}"
            (task / "step_0" / "task_0").mkdir(parents=True)
            (task / "step_0" / "task_0" / "cgroup.procs").write_text("")

    def end_cgroup(self, jobid: str, uid: int = 1001) -> None:
        for ctrl in ("memory", "freezer"):
            job_dir = self.cgroup_root / ctrl / "slurm_node1" / f"uid_{uid}" / f"job_{jobid}"
            for path in sorted(job_dir.rglob("*"), reverse=True):
                path.unlink() if path.is_file() else path.rmdir()
            job_dir.rmdir()

    def record(self, jobid: str, **fields: object) -> None:
        fd = spool.open_spool_dir(str(self.spool_dir))
        try:
            spool.write_record(fd, spool.JobRecord(jobid=jobid, uid=1001, user="alice",
                                                   **fields))  # type: ignore[arg-type]
        finally:
            os.close(fd)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def make_registry(node: Node, clock: Clock, lookup: JobLookup | None = None,
                  errors: SourceErrors | None = None) -> JobTracker:
    return JobTracker(
        str(node.spool_dir), CgroupFS(node.cgroup_root, rescan_interval=0),
        SlurmMetadata(lookup, clock=clock),
        errors or SourceErrors(), job_linger=60, cgroup_grace=30,
        trusted_uids=frozenset({0, os.geteuid()}), clock=clock,
    )


def test_job_with_spool_record_and_cgroup_is_running(node: Node) -> None:
    node.record("10", start_time=5.0, job_gpus="0,1", account="phys")
    node.start_cgroup("10")
    [job] = make_registry(node, Clock(1_000_000.0)).refresh()
    assert (job.jobid, job.user, job.account, job.source) == ("10", "alice", "phys", "spool")
    assert job.running and job.cgroup is not None and job.job_gpus == "0,1"


def test_job_without_spool_record_is_discovered_with_slurm_metadata(node: Node) -> None:
    node.start_cgroup("11", uid=1002)
    asked: list[str] = []

    def lookup(jobid: str) -> SlurmJobInfo:
        asked.append(jobid)
        return SlurmJobInfo(jobid=jobid, uid=1002, user="bob", account="chem",
                            partition="gpu", name="train", job_gpus="2", start_time=123.0)

    registry = make_registry(node, Clock(1_000_000.0), lookup)
    [job] = registry.refresh()
    registry.refresh()
    assert (job.jobid, job.user, job.account, job.partition, job.name) == (
        "11", "bob", "chem", "gpu", "train")
    assert job.source == "cgroup" and job.job_gpus == "2" and job.start_time == 123.0
    assert asked == ["11"], "metadata is looked up once per job, not per sample"


def test_a_job_is_built_once_and_again_only_when_what_it_is_built_from_changes(
        node: Node) -> None:
    node.record("14", start_time=5.0, job_gpus="0")
    node.start_cgroup("14")
    answers: dict[str, SlurmJobInfo] = {}

    def lookup(jobid: str) -> SlurmJobInfo | None:
        return answers.get(jobid)

    clock = Clock(1_000_000.0)
    registry = make_registry(node, clock, lookup)
    [first] = registry.refresh()
    [again] = registry.refresh()
    assert again is first and again.info() is first.info()
    assert again.allocation is first.allocation  # parsed once, not once per sample
    answers["14"] = SlurmJobInfo(jobid="14", uid=1001, user="alice", name="train")
    clock.now += 400  # past the look-up's retry back-off
    [named] = registry.refresh()
    assert named is not first and named.name == "train"
    assert registry.refresh()[0] is named
    node.record("14", start_time=5.0, job_gpus="0", end_time=9.0)  # the epilog
    [ended] = registry.refresh()
    assert ended is not named and ended.end_time == 9.0 and not ended.running


def test_qos_comes_from_the_record_else_from_slurm(node: Node) -> None:
    node.record("12", start_time=5.0, qos="high")
    node.record("13", start_time=5.0)  # a prolog that was given no SLURM_JOB_QOS
    node.start_cgroup("12", uid=1001)
    node.start_cgroup("13", uid=1001)

    def lookup(jobid: str) -> SlurmJobInfo:
        return SlurmJobInfo(jobid=jobid, uid=1001, user="alice", qos="normal")

    jobs = make_registry(node, Clock(1_000_000.0), lookup).refresh()
    assert [(j.jobid, j.qos, j.info().qos) for j in jobs] == [
        ("12", "high", "high"), ("13", "normal", "normal")]


def test_discovered_job_without_slurm_keeps_uid_from_the_cgroup_path(node: Node) -> None:
    node.start_cgroup("12", uid=0)
    [job] = make_registry(node, Clock(1_000_000.0), lookup=None).refresh()
    assert job.uid == 0 and job.user == "root"


def test_record_whose_cgroup_vanished_without_epilog_ends_after_the_grace(node: Node) -> None:
    clock = Clock(1_000_000.0)
    node.record("13", start_time=1.0)
    node.start_cgroup("13")
    registry = make_registry(node, clock)
    registry.refresh()
    node.end_cgroup("13")
    gone_at = clock.now = clock.now + 5
    assert registry.refresh()[0].running, "the epilog may still come"
    clock.now += 29
    assert registry.refresh()[0].running
    clock.now += 2
    [job] = registry.refresh()
    assert job.end_time == gone_at
    clock.now += 59
    assert registry.refresh(), "it lingers in full from when it was found ended"
    clock.now += 2
    assert registry.refresh() == []


def test_epilog_ends_the_job_and_it_lingers_then_goes_with_its_record(node: Node) -> None:
    clock = Clock(1_000_000.0)
    node.record("14", start_time=1.0)
    node.start_cgroup("14")
    registry = make_registry(node, clock)
    registry.refresh()
    node.record("14", start_time=1.0, end_time=clock.now)
    node.end_cgroup("14")
    assert not registry.refresh()[0].running
    clock.now += 59
    [job] = registry.refresh()
    assert not job.running
    clock.now += 2
    assert registry.refresh() == []
    assert not (node.spool_dir / "14.json").exists()
    assert registry.refresh() == []


def test_leftover_cgroup_of_an_expired_job_does_not_revive_it(node: Node) -> None:
    clock = Clock(1_000_000.0)
    node.start_cgroup("15")
    node.record("15", start_time=1.0, end_time=clock.now)
    registry = make_registry(node, clock)
    registry.refresh()
    clock.now += 61
    assert registry.refresh() == []
    clock.now += 10
    assert registry.refresh() == []


def test_requeued_job_with_a_new_prolog_record_runs_again(node: Node) -> None:
    clock = Clock(1_000_000.0)
    node.record("16", start_time=1.0, end_time=clock.now)
    registry = make_registry(node, clock)
    assert not registry.refresh()[0].running
    node.record("16", start_time=3.0)
    assert registry.refresh()[0].running


@pytest.mark.parametrize("linger_first", [False, True])
def test_job_requeued_onto_this_node_without_a_prolog_runs_again_with_its_new_start(
    node: Node, linger_first: bool
) -> None:
    # Slurm 22.05 runs no prolog for a batch job requeued onto the node it ran on: the
    # new run shows only as a new cgroup under the same job id, while the record still
    # says the first run ended. It must not be taken for a leftover of the first run.
    clock = Clock(1_000_000.0)
    starts = {"17": 1.0}

    def lookup(jobid: str) -> SlurmJobInfo:
        return SlurmJobInfo(jobid=jobid, state="RUNNING", start_time=starts[jobid])

    node.record("17", start_time=1.0)
    node.start_cgroup("17")
    registry = make_registry(node, clock, lookup)
    (job,) = registry.refresh()
    assert job.running and job.start_time == 1.0
    node.record("17", start_time=1.0, end_time=clock.now)  # the epilog of the first run
    for ctrl in ("memory", "freezer"):  # kept aside: the new cgroup gets another inode
        old = node.cgroup_root / ctrl / "slurm_node1" / "uid_1001" / "job_17"
        old.rename(old.with_name("old_17"))
    clock.now += 1
    (job,) = registry.refresh()
    assert not job.running
    if linger_first:
        clock.now += 61
        assert registry.refresh() == []
    starts["17"] = clock.now + 1
    node.start_cgroup("17")
    clock.now += 2
    (job,) = registry.refresh()
    assert job.running and job.start_time == starts["17"] and job.cgroup is not None


def test_leftover_cgroup_of_an_ended_job_does_not_restart_it(node: Node) -> None:
    clock = Clock(1_000_000.0)
    node.record("18", start_time=1.0)
    node.start_cgroup("18")
    registry = make_registry(node, clock)
    registry.refresh()
    node.record("18", start_time=1.0, end_time=clock.now)
    clock.now += 1
    for _ in range(3):
        (job,) = registry.refresh()
        assert not job.running


def test_hostile_spool_files_are_skipped_counted_once_and_others_unaffected(node: Node) -> None:
    node.record("20", start_time=1.0)
    (node.spool_dir / "21.json").write_text("{not json")
    (node.spool_dir / "22.json").write_bytes(b"x" * (spool.MAX_RECORD_BYTES + 10))
    (node.spool_dir / "23.json").symlink_to(node.spool_dir / "20.json")
    (node.spool_dir / "..json").write_text("{}")
    (node.spool_dir / "notes.txt").write_text("hello")
    errors = SourceErrors()
    registry = make_registry(node, Clock(1_000_000.0), errors=errors)
    jobs = registry.refresh()
    registry.refresh()
    assert [j.jobid for j in jobs] == ["20"]
    assert errors.snapshot()["spool"] == 4, "notes.txt and .json also refused, once each"


def test_the_training_relays_socket_in_the_spool_is_not_a_malformed_record(
        node: Node) -> None:
    node.record("20", start_time=1.0)
    relay = TrainingRelay(node.spool_dir, lambda pid: None)
    relay.start()
    try:
        assert (node.spool_dir / "training.sock").is_socket()
        errors = SourceErrors()
        jobs = make_registry(node, Clock(1_000_000.0), errors=errors).refresh()
        assert [j.jobid for j in jobs] == ["20"]
        assert errors.snapshot()["spool"] == 0
    finally:
        relay.stop()
    # Any other socket is still an odd file, counted.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
        other.bind(str(node.spool_dir / "other.sock"))
        errors = SourceErrors()
        make_registry(node, Clock(1_000_000.0), errors=errors).refresh()
        assert errors.snapshot()["spool"] == 1


def test_a_changed_bad_file_is_counted_again(node: Node) -> None:
    errors = SourceErrors()
    registry = make_registry(node, Clock(1_000_000.0), errors=errors)
    (node.spool_dir / "30.json").write_text("{bad")
    registry.refresh()
    (node.spool_dir / "30.json").write_text("{still bad, but new}")
    registry.refresh()
    assert errors.snapshot()["spool"] == 2


def test_missing_spool_dir_is_not_an_error(node: Node, tmp_path: Path) -> None:
    node.spool_dir.rmdir()
    errors = SourceErrors()
    assert make_registry(node, Clock(1_000_000.0), errors=errors).refresh() == []
    assert errors.snapshot()["spool"] == 0


def test_record_never_seen_in_cgroups_ends_when_slurm_says_so(node: Node) -> None:
    clock = Clock(1_000_000.0)
    node.record("40", start_time=1.0)
    states = {"40": "RUNNING"}

    def lookup(jobid: str) -> SlurmJobInfo:
        return SlurmJobInfo(jobid=jobid, state=states[jobid])

    registry = make_registry(node, clock, lookup)
    registry.refresh()
    clock.now += 200
    assert registry.refresh()[0].running
    states["40"] = "COMPLETED"
    clock.now += 30
    assert registry.refresh()[0].running, "state is re-checked after a back-off, not per sample"
    clock.now += 31
    assert not registry.refresh()[0].running


def _never_seen_job_after(registry: JobTracker, clock: Clock, minutes: int) -> bool:
    """Whether job 41 still runs after ``minutes`` of one sample a second."""
    for _ in range(minutes * 60):
        clock.now += 1
        jobs = registry.refresh()
    return bool(jobs) and jobs[0].running


def test_record_never_seen_in_cgroups_ends_once_slurm_no_longer_knows_it(node: Node) -> None:
    # A prolog ran, the job never got a cgroup here, and the controller forgot it:
    # without a bound the record stays "running" for ever.
    clock = Clock(1_000_000.0)
    node.record("41", start_time=1.0)
    asked: list[str] = []

    def lookup(jobid: str) -> SlurmJobInfo | None:
        asked.append(jobid)
        return None

    registry = make_registry(node, clock, lookup)
    registry.refresh()
    assert _never_seen_job_after(registry, clock, 2)
    assert not _never_seen_job_after(registry, clock, 10)
    # About one look-up a minute over 12 minutes of samples, not one per sample.
    assert len(asked) <= 13, len(asked)


def test_record_never_seen_in_cgroups_ends_when_slurm_lookups_keep_failing(node: Node) -> None:
    clock = Clock(1_000_000.0)
    node.record("41", start_time=1.0)

    def lookup(jobid: str) -> SlurmJobInfo | None:
        raise RuntimeError("scontrol did not answer within 5 s")

    registry = make_registry(node, clock, lookup)
    registry.refresh()
    assert not _never_seen_job_after(registry, clock, 10)


def test_record_never_seen_in_cgroups_stays_while_slurm_reports_it_running(node: Node) -> None:
    clock = Clock(1_000_000.0)
    node.record("41", start_time=1.0)

    def lookup(jobid: str) -> SlurmJobInfo | None:
        return SlurmJobInfo(jobid=jobid, state="RUNNING")

    registry = make_registry(node, clock, lookup)
    registry.refresh()
    assert _never_seen_job_after(registry, clock, 15)


def test_expired_record_that_cannot_be_deleted_is_logged_at_warning_once(
    node: Node, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock(1_000_000.0)
    node.record("42", start_time=1.0, end_time=clock.now)

    def refuse(dir_fd: int, jobid: str) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(spool, "remove_record", refuse)
    registry = make_registry(node, clock)
    registry.refresh()
    for _ in range(5):
        clock.now += 61
        assert registry.refresh() == []
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "42" in r.message]
    assert len(warnings) == 1, [r.message for r in caplog.records]
    assert "Permission denied" in warnings[0].message


def _v2_sluid_node(root: Path, sluid: str) -> Path:
    cg = root / "cg2"
    task = cg / "system.slice" / "slurmstepd.scope" / sluid / "step_0" / "user" / "task_0"
    task.mkdir(parents=True)
    (cg / "cgroup.controllers").write_text("cpuset cpu memory pids\n")
    (task / "cgroup.procs").write_text("")
    return cg


def test_sluid_named_cgroup_joins_the_record_carrying_that_sluid(node: Node,
                                                                  tmp_path: Path) -> None:
    cg = _v2_sluid_node(tmp_path, "sEKNKTV3WPV500")
    node.record("50", start_time=1.0, sluid="sEKNKTV3WPV500")
    registry = JobTracker(str(node.spool_dir), CgroupFS(cg, rescan_interval=0),
                        SlurmMetadata(None), SourceErrors(),
                        trusted_uids=frozenset({0, os.geteuid()}))
    [job] = registry.refresh()
    assert job.jobid == "50" and job.cgroup is not None and job.cgroup.is_sluid


def test_sluid_named_cgroup_without_record_is_resolved_through_slurm(node: Node,
                                                                      tmp_path: Path) -> None:
    cg = _v2_sluid_node(tmp_path, "sEKNKTV3WPV501")

    def lookup(key: str) -> SlurmJobInfo | None:
        if key in ("sEKNKTV3WPV501", "51"):
            return SlurmJobInfo(jobid="51", sluid="sEKNKTV3WPV501", uid=1003, user="carol",
                                state="RUNNING")
        return None

    registry = JobTracker(str(node.spool_dir), CgroupFS(cg, rescan_interval=0),
                        SlurmMetadata(lookup), SourceErrors())
    [job] = registry.refresh()
    assert (job.jobid, job.user, job.source) == ("51", "carol", "cgroup")


def test_failed_sluid_lookup_is_counted_under_slurm(node: Node, tmp_path: Path) -> None:
    cg = _v2_sluid_node(tmp_path, "sEKNKTV3WPV502")

    def unreachable(key: str) -> SlurmJobInfo | None:
        raise RuntimeError("slurmctld not responding")

    errors = SourceErrors()
    registry = JobTracker(str(node.spool_dir), CgroupFS(cg, rescan_interval=0),
                        SlurmMetadata(unreachable, errors=errors), errors)
    assert registry.refresh() == []  # the job waits until Slurm names it
    assert errors.snapshot() == {"spool": 0, "cgroup": 0, "slurm": 1, "nvml": 0, "state": 0,
                                 "training": 0, "powercap": 0, "nodepower": 0}
    assert errors.take_failed() == {"slurm"}


class FlakyCgroupFS(CgroupFS):
    """A CgroupFS whose next scans fail, as a walk does when a hierarchy vanishes midway."""

    fail_scans = 0

    def find_jobs(self, expected=()):  # type: ignore[no-untyped-def]
        if self.fail_scans:
            self.fail_scans -= 1
            raise OSError(2, "No such file or directory", str(self.root / "memory"))
        return super().find_jobs(expected)


def test_a_failed_cgroup_scan_does_not_revive_an_expired_job(node: Node) -> None:
    # The job ended and expired, its record is gone, and Slurm has not removed its
    # cgroup yet. One failed scan must not make the registry forget it expired.
    clock = Clock(1_000_000.0)
    cgroups = FlakyCgroupFS(node.cgroup_root, rescan_interval=0)
    errors = SourceErrors()
    registry = JobTracker(str(node.spool_dir), cgroups, SlurmMetadata(None, clock=clock),
                        errors, job_linger=60, cgroup_grace=30,
                        trusted_uids=frozenset({0, os.geteuid()}), clock=clock)
    node.record("19", start_time=1.0)
    node.start_cgroup("19")
    assert registry.refresh()[0].running
    node.record("19", start_time=1.0, end_time=clock.now)
    assert not registry.refresh()[0].running
    clock.now += 61
    assert registry.refresh() == []
    assert not (node.spool_dir / "19.json").exists()
    cgroups.fail_scans = 1
    clock.now += 5
    assert registry.refresh() == []
    assert errors.snapshot()["cgroup"] == 1
    for _ in range(3):
        clock.now += 5
        assert registry.refresh() == [], "the leftover cgroup came back as a running job"


def test_a_failed_cgroup_scan_ends_no_running_job(node: Node) -> None:
    clock = Clock(1_000_000.0)
    cgroups = FlakyCgroupFS(node.cgroup_root, rescan_interval=0)
    registry = JobTracker(str(node.spool_dir), cgroups, SlurmMetadata(None, clock=clock),
                        SourceErrors(), job_linger=60, cgroup_grace=30,
                        trusted_uids=frozenset({0, os.geteuid()}), clock=clock)
    node.start_cgroup("24")  # discovered: no record to wait for, ends at once when gone
    assert registry.refresh()[0].running
    cgroups.fail_scans = 3
    for _ in range(3):
        clock.now += 40
        [job] = registry.refresh()
        assert job.running and job.cgroup is not None
    clock.now += 5
    assert registry.refresh()[0].running


def test_a_requeue_with_a_new_prolog_record_is_a_fresh_run_that_ends_once(node: Node) -> None:
    # Run 1 ends; run 2 comes with a new prolog record and a new cgroup. When run 2
    # ends while its cgroup is still there, no third run may appear.
    clock = Clock(1_000_000.0)
    registry = make_registry(node, clock)
    node.record("25", start_time=1.0)
    node.start_cgroup("25")
    (job,) = registry.refresh()
    assert job.running and job.start_time == 1.0
    node.record("25", start_time=1.0, end_time=clock.now)
    for ctrl in ("memory", "freezer"):  # kept aside: the new cgroup gets another inode
        old = node.cgroup_root / ctrl / "slurm_node1" / "uid_1001" / "job_25"
        old.rename(old.with_name("old_25"))
    clock.now += 1
    assert not registry.refresh()[0].running
    clock.now += 1
    node.record("25", start_time=clock.now)
    node.start_cgroup("25")
    run2_start = clock.now
    (job,) = registry.refresh()
    assert job.running and job.start_time == run2_start and job.source == "spool"
    clock.now += 10
    node.record("25", start_time=run2_start, end_time=clock.now)  # its epilog; cgroup stays
    for _ in range(3):
        clock.now += 1
        (job,) = registry.refresh()
        assert not job.running, "run 2's own cgroup was taken for a third run"
        assert job.start_time == run2_start and job.source == "spool"
