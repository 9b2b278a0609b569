"""The relay inside the agent: the real sampler and job tracker over a synthetic node, the
real relay on a unix socket, and real sender processes whose pids the node's /proc puts
in (or out of) a job."""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slurm_gpu_exporter.exposition.rendered import render
from slurm_gpu_exporter.exposition.snapshot import Snapshot
from slurm_gpu_exporter.jobs.stats import JobStatsCollector
from slurm_gpu_exporter.jobs.tracker import JobTracker
from slurm_gpu_exporter.node.cgroup import CgroupFS
from slurm_gpu_exporter.node.slurm.lookup import SlurmMetadata
from slurm_gpu_exporter.node.source_health import SourceErrors
from slurm_gpu_exporter.sampling.sampler import Sampler
from slurm_gpu_exporter.sim.synthnode import SynthNode
from slurm_gpu_exporter.training_relay import JobIdentity, RelayLimits, TrainingRelay
from slurm_gpu_exporter.training_relay.source import RelayJobs, TrainingSource
from tests.support import wait_until
from tests.support.agent import series
from tests.training_relay.conftest import Sender

pytestmark = pytest.mark.process

DEMO = "slurm_job_training_demo_value"


@dataclass
class Rig:
    node: SynthNode
    errors: SourceErrors
    relay: TrainingRelay
    source: TrainingSource
    sampler: Sampler
    published: list[tuple[Snapshot, str]]

    def sample(self) -> tuple[Snapshot, str]:
        self.sampler.sample_once()
        return self.published[-1]


def _rig(base: Path, limits: RelayLimits) -> Rig:
    node = SynthNode(base)
    errors = SourceErrors()
    cgroups = CgroupFS(node.cgroup_root, rescan_interval=0)
    # No linger and no grace: a job whose cgroup went is dropped two samples later.
    tracker = JobTracker(str(node.spool_dir), cgroups, SlurmMetadata(None), errors,
                        proc_root=node.proc_root, job_linger=0, cgroup_grace=0,
                        trusted_uids=frozenset({0, os.geteuid()}))
    jobs = RelayJobs(node.proc_root, cgroups)
    relay = TrainingRelay(node.spool_dir, jobs.job_of_pid, job_of_key=jobs.job_of_key,
                          limits=limits)
    relay.start()
    source = TrainingSource(relay, jobs, errors)
    published: list[tuple[Snapshot, str]] = []
    sampler = Sampler([tracker, JobStatsCollector(cgroups, node.proc_root, errors), source],
                      errors, 1.0,
                      publish=lambda s: published.append((s, render(s).text.decode())))
    return Rig(node, errors, relay, source, sampler, published)


@pytest.fixture
def rig(spool: str, limits: RelayLimits) -> Iterator[Rig]:
    # Under the short `spool` temp dir: the socket path must fit in 107 bytes.
    rig = _rig(Path(spool) / "node", limits)
    yield rig
    rig.relay.stop()


@pytest.fixture
def senders(spool: str) -> Iterator[Callable[..., Sender]]:
    """Sender processes that push to the synthetic node's spool (see _rig)."""
    started: list[Sender] = []

    def start(*args: str) -> Sender:
        started.append(Sender(str(Path(spool) / "node" / "spool"), *args))
        return started[-1]

    yield start
    for sender in started:
        sender.kill()


def _training(snapshot: Snapshot, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value
            for f in snapshot.training for s in f.samples if s.name == name}


def _up(text: str) -> dict[str, float]:
    return {labels["source"]: v for labels, v in series(text, "slurm_gpu_exporter_source_up")}


def _errors(text: str) -> dict[str, float]:
    return {labels["source"]: v for labels, v in
            series(text, "slurm_gpu_exporter_sample_errors_total")}


def test_a_jobs_process_publishes_under_the_jobid_and_user_the_registry_reports(
        rig, senders):
    sender = senders("client", "3.5", "0.4")
    rig.node.add_job(4101, [sender.pid], user="alice")
    rig.sample()  # the registry reports the job
    sender.go()
    wait_until(lambda: rig.relay.families())
    snapshot, text = rig.sample()
    # The payload said jobid="forged", user="mallory".
    assert _training(snapshot, DEMO) == {(("jobid", "4101"), ("user", "alice")): 3.5}
    assert series(text, DEMO) == [({"jobid": "4101", "user": "alice"}, 3.5)]
    names = [f.name for f in text_string_to_metric_families(text)]
    assert names.index("slurm_job_training_demo_value") > names.index("slurm_gpu_exporter_jobs")
    assert _up(text)["training"] == 1 and _errors(text)["training"] == 0
    assert "training" in {s.name for s in snapshot.steps}
    sender.finish()


def test_a_process_that_connects_before_the_agent_knows_its_job_waits_and_is_credited(
        rig, senders):
    sender = senders("client", "2", "1.5")
    rig.node.add_job(4102, [sender.pid], user="bob")
    sender.go()  # connects at once: the registry has not sampled the new job yet
    wait_until(lambda: rig.relay.connections() == 1)
    assert rig.relay.families() == []
    rig.sample()
    wait_until(lambda: rig.relay.families())
    snapshot, _ = rig.sample()
    assert _training(snapshot, DEMO) == {(("jobid", "4102"), ("user", "bob")): 2.0}
    assert rig.relay.error_counts()["refused"] == 0
    sender.finish()


def test_a_process_in_a_job_the_agent_never_reports_is_refused_after_the_wait(
        spool, limits, senders):
    rig = _rig(Path(spool) / "node", dataclasses.replace(limits, pending_seconds=0.3))
    try:
        sender = senders("raw", "small", "5", "2")  # one connection, kept until refused
        # In job 777's cgroup (by /proc), but the job has no cgroup dir or record: the
        # registry never reports it.
        rig.node.add_process(sender.pid, 1001,
                             cgroup_path="/slurm_node1/uid_1001/job_777/step_0/task_0")
        _, text = rig.sample()
        sender.go()
        wait_until(lambda: rig.relay.error_counts()["refused"] == 1)
        _, text = rig.sample()
        assert _up(text)["training"] == 0 and _errors(text)["training"] == 1
        _, text = rig.sample()  # nothing new: up again, and the refusal counted once
        assert _up(text)["training"] == 1 and _errors(text)["training"] == 1
        assert rig.relay.families() == []
        sender.finish()
    finally:
        rig.relay.stop()


def test_the_environment_never_decides_the_job(rig, senders):
    rig.node.add_job(4103, [], user="alice")
    sender = senders("client", "6", "0.3")
    # SLURM_JOB_ID=4103 in its environment, but it runs in a login session.
    rig.node.add_process(sender.pid, 1002, environ={"SLURM_JOB_ID": "4103"})
    rig.sample()
    sender.go()
    wait_until(lambda: rig.relay.error_counts()["refused"] >= 1)
    sender.finish()
    assert rig.relay.families() == []
    _, text = rig.sample()
    assert _errors(text)["training"] >= 1 and DEMO not in text


def test_a_jobs_series_go_when_the_registry_drops_the_job(rig, senders):
    keep = senders("client", "1", "30")
    gone = senders("client", "2", "30")
    rig.node.add_job(4104, [keep.pid], user="alice")
    rig.node.add_job(4105, [gone.pid], user="bob")
    rig.sample()
    keep.go()
    gone.go()
    wait_until(lambda: len(series_of_demo(rig)) == 2)
    rig.node.remove_job(4105)  # no epilog, no grace, no linger
    rig.sample()  # the cgroup is missing ...
    snapshot, text = rig.sample()  # ... so the job ended and expired
    assert 'jobid="4105"' not in text
    assert _training(snapshot, DEMO) == {(("jobid", "4104"), ("user", "alice")): 1.0}
    assert "4105" not in rig.relay.jobs()
    wait_until(lambda: rig.relay.connections() == 1)  # the dropped job's connection closed
    keep.kill()
    gone.kill()


def series_of_demo(rig: Rig) -> list[float]:
    return [s.value for f in rig.relay.families() for s in f.samples if s.name == DEMO]


def test_series_of_a_job_the_registry_does_not_report_are_forgotten(rig):
    # As after a restart: the relay holds a job the registry no longer reports.
    rig.relay.store.ingest(JobIdentity("999", "ghost"), b"demo_value 1\n")
    assert rig.relay.jobs() == {"999"}
    snapshot, text = rig.sample()
    assert snapshot.training == () and rig.relay.jobs() == set()
    assert "ghost" not in text


def test_nothing_is_forgotten_when_the_registry_failed(rig):
    rig.relay.store.ingest(JobIdentity("999", "ghost"), b"demo_value 1\n")
    families = rig.source.sample(None)
    assert rig.relay.jobs() == {"999"} and families


def test_a_crashing_relay_counts_under_training_and_the_sample_goes_on(rig, monkeypatch):
    rig.node.add_job(4106, [], user="alice")

    def broken() -> list:
        raise RuntimeError("boom")

    monkeypatch.setattr(rig.relay, "families", broken)
    snapshot, text = rig.sample()
    assert [s.job.jobid for s in snapshot.jobs] == ["4106"] and snapshot.training == ()
    assert _up(text)["training"] == 0 and _errors(text)["training"] == 1


class _PeerInAnotherPidNamespace:
    """A connection whose SO_PEERCRED pid is 0: the sender's pid namespace is not ours."""

    closed = False

    def setblocking(self, flag: bool) -> None:
        pass

    def getsockopt(self, level: int, option: int, size: int) -> bytes:
        assert (level, option) == (socket.SOL_SOCKET, socket.SO_PEERCRED)
        return (0).to_bytes(4, "little") + (1000).to_bytes(4, "little") * 2

    def close(self) -> None:
        self.closed = True


def test_a_sender_in_another_pid_namespace_is_refused(spool):
    asked: list[int] = []

    def anyone(pid: int) -> tuple[str, str]:
        asked.append(pid)
        return ("1", "alice")

    relay = TrainingRelay(spool, anyone)
    peer = _PeerInAnotherPidNamespace()
    assert relay._admission.admit(peer, set(), 0.0) is None  # type: ignore[arg-type]
    assert peer.closed and asked == [] and relay.error_counts()["refused"] == 1


def test_the_relay_thread_is_woken_only_when_the_registrys_jobs_change(rig, monkeypatch):
    """Pending connections wait for their job, so a sample with the same jobs as the
    last has nothing to tell the relay; a new job wakes it in the sample that finds it."""
    woken: list[int] = []
    real = rig.relay.jobs_changed
    monkeypatch.setattr(rig.relay, "jobs_changed", lambda: (woken.append(1), real())[1])
    rig.sample()
    rig.sample()
    assert woken == []
    rig.node.add_job(4105, [os.getpid()], user="carol")
    rig.sample()
    assert len(woken) == 1
    rig.sample()
    assert len(woken) == 1
