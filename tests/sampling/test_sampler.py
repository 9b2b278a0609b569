"""The sampler over a synthetic node: real job tracker, cgroup reader and GPU sampler."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_exporter.exposition.rendered import Exposition, render
from slurm_gpu_exporter.exposition.snapshot import NodeIdentity, Snapshot
from slurm_gpu_exporter.gpu.backend import GpuUnavailable
from slurm_gpu_exporter.gpu.readings import DeviceReading, XidEvent
from slurm_gpu_exporter.gpu.source import GpuSampler
from slurm_gpu_exporter.jobs.cpu_energy import CpuEnergySource
from slurm_gpu_exporter.jobs.node_energy import NodeEnergySource
from slurm_gpu_exporter.jobs.stats import JobStatsCollector
from slurm_gpu_exporter.jobs.tracker import JobTracker
from slurm_gpu_exporter.node.cgroup import CgroupFS
from slurm_gpu_exporter.node.hwmon import HwmonPowerMeter
from slurm_gpu_exporter.node.powercap import PowercapReader
from slurm_gpu_exporter.node.slurm.lookup import SlurmMetadata
from slurm_gpu_exporter.node.source_health import SOURCES, SourceErrors
from slurm_gpu_exporter.node.state_dir import StateStore
from slurm_gpu_exporter.sampling.sampler import Sampler
from slurm_gpu_exporter.sim.synthnode import SynthNode
from slurm_gpu_exporter.training_relay import TrainingRelay
from slurm_gpu_exporter.training_relay.source import RelayJobs, TrainingSource
from tests.support.agent import series
from tests.support.powercap import PowercapTree


class NoLibrary:
    """A GPU backend on a node without libnvidia-ml, as NvmlBackend.init reports it."""

    def __init__(self) -> None:
        self.inits = 0

    def init(self) -> str:
        self.inits += 1
        raise GpuUnavailable("libnvidia-ml.so.1 not found")

    def read(self, cursors: dict[str, tuple[int, int]]) -> list[DeviceReading]:
        raise AssertionError("never initialised")

    def wait_xid(self, timeout_ms: int) -> list[XidEvent]:
        return []

    def shutdown(self) -> None:
        pass


def _sampler(node: SynthNode, errors: SourceErrors, *, state_dir: Path | None = None,
             gpu: Any = None, metadata: SlurmMetadata | None = None,
             training: TrainingSource | None = None,
             cpu_energy: CpuEnergySource | None = None,
             node_energy: NodeEnergySource | None = None,
             ) -> tuple[Sampler, list[tuple[Snapshot, Exposition]]]:
    cgroups = CgroupFS(node.cgroup_root)
    tracker = JobTracker(str(node.spool_dir), cgroups, metadata or SlurmMetadata(None), errors,
                        proc_root=node.proc_root, trusted_uids=frozenset({0, os.geteuid()}))
    published: list[tuple[Snapshot, Exposition]] = []
    sources = [tracker, JobStatsCollector(cgroups, node.proc_root, errors), cpu_energy, gpu,
               node_energy, training]  # in the agent's order (agent/sources.py)
    sampler = Sampler(
        [s for s in sources if s is not None], errors, 5.0,
        state=StateStore(state_dir) if state_dir is not None else None,
        publish=lambda s: published.append((s, render(s))),
    )
    return sampler, published


def _source_up(exposition: Exposition) -> dict[str, float]:
    return {labels["source"]: value for labels, value in
            series(exposition.text.decode(), "slurm_gpu_exporter_source_up")}


def _errors(exposition: Exposition) -> dict[str, float]:
    return {labels["source"]: value for labels, value in
            series(exposition.text.decode(), "slurm_gpu_exporter_sample_errors_total")}


def test_a_sample_publishes_the_jobs_it_found(tmp_path: Path) -> None:
    node = SynthNode(tmp_path)
    node.add_job(4101, [5001])
    sampler, published = _sampler(node, SourceErrors(), state_dir=node.state_dir)
    snapshot = sampler.sample_once()
    assert [s.job.jobid for s in snapshot.jobs] == ["4101"]
    assert published[-1][0] is snapshot
    text = published[-1][1].text.decode()
    assert 'slurm_job_info{' in text and 'jobid="4101"' in text
    assert {s.name for s in snapshot.steps} == {"registry", "cgroup", "state"}
    assert (node.state_dir / "state.json").exists()


def test_every_sample_names_the_slurm_node_and_cluster(tmp_path: Path) -> None:
    node = SynthNode(tmp_path)
    sampler, published = _sampler(node, SourceErrors())
    sampler.identity = NodeIdentity("gpu01", "c1")
    for _ in range(2):
        sampler.sample_once()
        assert series(published[-1][1].text.decode(), "slurm_gpu_exporter_node_info") == [
            ({"slurm_node": "gpu01", "slurm_cluster": "c1"}, 1.0)]


def test_source_up_and_sample_errors_share_one_set_of_source_values(tmp_path: Path) -> None:
    node = SynthNode(tmp_path)
    errors = SourceErrors()
    jobs = RelayJobs(node.proc_root, CgroupFS(node.cgroup_root))
    relay = TrainingRelay(node.spool_dir, jobs.job_of_pid, job_of_key=jobs.job_of_key)
    relay.start()
    try:
        sampler, published = _sampler(node, errors, state_dir=node.state_dir,
                                      gpu=GpuSampler(NoLibrary(), node.proc_root, errors),
                                      training=TrainingSource(relay, jobs, errors),
                                      cpu_energy=CpuEnergySource(
                                          PowercapReader(node.base / "powercap"),
                                          node.proc_root, errors, busy=lambda _root: 0.0),
                                      node_energy=NodeEnergySource(
                                          HwmonPowerMeter(node.base / "hwmon"), errors))
        sampler.sample_once()
    finally:
        relay.stop()
    exposition = published[-1][1]
    assert set(_source_up(exposition)) == set(SOURCES)
    assert set(_errors(exposition)) == set(SOURCES)
    duration = {labels["source"] for labels, _ in series(
        exposition.text.decode(), "slurm_gpu_exporter_sample_duration_seconds")}
    assert duration == {"registry", "cgroup", "powercap", "nvml", "nodepower", "training",
                        "state", "total"}


def test_without_the_training_relay_there_is_no_training_source_up(tmp_path: Path) -> None:
    sampler, published = _sampler(SynthNode(tmp_path), SourceErrors())
    sampler.sample_once()
    assert "training" not in _source_up(published[-1][1])
    assert published[-1][0].training == ()


def test_a_failed_slurm_lookup_is_the_slurm_sources_problem_not_the_registrys(
        tmp_path: Path) -> None:
    node = SynthNode(tmp_path)
    node.add_job(4101, [5001])  # the prolog never knows the job name: Slurm is asked
    asked: list[str] = []

    def unreachable(jobid: str) -> None:
        asked.append(jobid)
        raise RuntimeError("slurmctld not responding")

    errors = SourceErrors()
    sampler, published = _sampler(node, errors,
                                  metadata=SlurmMetadata(unreachable, errors=errors))
    snapshot = sampler.sample_once()
    assert asked == ["4101"]
    assert [s.job.jobid for s in snapshot.jobs] == ["4101"]  # the job is still reported
    assert _source_up(published[-1][1]) == {"spool": 1, "cgroup": 1, "slurm": 0}
    assert _errors(published[-1][1]) == {"spool": 0, "cgroup": 0, "slurm": 1, "nvml": 0,
                                         "state": 0, "training": 0, "powercap": 0,
                                         "nodepower": 0}
    sampler.sample_once()  # look-ups are paused after a failure: nothing failed this time
    assert _source_up(published[-1][1])["slurm"] == 1
    assert _errors(published[-1][1])["slurm"] == 1


def test_a_source_is_down_only_for_errors_counted_during_the_sample(tmp_path: Path) -> None:
    node = SynthNode(tmp_path)
    errors = SourceErrors()
    sampler, published = _sampler(node, errors)
    errors.count("cgroup", "counted between two samples", log_it=False)
    sampler.sample_once()
    assert _source_up(published[-1][1])["cgroup"] == 1
    assert _errors(published[-1][1])["cgroup"] == 1


def test_nvml_source_is_down_whenever_nvml_is_down_not_only_when_an_init_is_retried(
        tmp_path: Path) -> None:
    node = SynthNode(tmp_path)
    errors = SourceErrors()
    backend = NoLibrary()
    gpu = GpuSampler(backend, node.proc_root, errors, reinit_after=3600)
    sampler, published = _sampler(node, errors, gpu=gpu)
    for _ in range(3):
        sampler.sample_once()
        text = published[-1][1].text.decode()
        assert series(text, "slurm_gpu_exporter_nvml_up") == [({}, 0.0)]
        assert _source_up(published[-1][1])["nvml"] == 0
    assert backend.inits == 1  # the later samples did not retry, so counted nothing
    assert _errors(published[-1][1])["nvml"] == 1
    gpu.close()


def test_a_source_that_raises_is_down_and_counted_and_the_others_still_report(
        tmp_path: Path) -> None:
    node = SynthNode(tmp_path)
    node.add_job(4101, [5001])
    errors = SourceErrors()
    sampler, published = _sampler(node, errors)

    def broken(jobs: list[Any]) -> list[Any]:
        raise RuntimeError("cgroup reader bug")

    jobstats: Any = sampler.source("cgroup")
    jobstats.collect = broken
    snapshot = sampler.sample_once()
    assert snapshot.jobs == ()
    up = _source_up(published[-1][1])
    assert up["cgroup"] == 0 and up["spool"] == 1
    assert snapshot.errors["cgroup"] == 1
    # The next sample, without a new error, is up again.
    jobstats.collect = JobStatsCollector(
        CgroupFS(node.cgroup_root), node.proc_root, errors).collect
    sampler.sample_once()
    assert _source_up(published[-1][1])["cgroup"] == 1


def test_an_unwritable_state_dir_is_counted_and_sampling_goes_on(tmp_path: Path) -> None:
    node = SynthNode(tmp_path)
    node.add_job(4101, [5001])
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # a file where the state dir's parent should be: even root fails
    errors = SourceErrors()
    sampler, published = _sampler(node, errors, state_dir=blocker / "state")
    for _ in range(2):
        snapshot = sampler.sample_once()
        assert [s.job.jobid for s in snapshot.jobs] == ["4101"]
        assert _source_up(published[-1][1])["state"] == 0
    assert _errors(published[-1][1])["state"] == 2
    assert not (blocker / "state").exists()


def test_the_loop_keeps_sampling_after_a_sample_crashes(tmp_path: Path) -> None:
    node = SynthNode(tmp_path)
    sampler, published = _sampler(node, SourceErrors())
    sampler.interval = 0.01
    calls = {"n": 0}
    real_render = sampler.publish

    def flaky_publish(snapshot: Snapshot) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("first publish fails")
        real_render(snapshot)
        if len(published) >= 2:
            sampler._stop.set()

    sampler.publish = flaky_publish
    sampler.start()
    assert sampler._thread is not None
    sampler._thread.join(20)
    sampler.stop()
    assert calls["n"] >= 3 and len(published) >= 2


def test_counting_an_unknown_source_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown error source"):
        SourceErrors().count("registry", "not a source")


def test_a_sample_renders_nothing_until_the_exposition_is_asked_for(tmp_path: Path) -> None:
    node = SynthNode(tmp_path)
    node.add_job(4101, [5001])
    sampler, published = _sampler(node, SourceErrors(), state_dir=node.state_dir)
    for _ in range(3):
        sampler.sample_once()
    assert [e.renders for _, e in published] == [0, 0, 0]
    assert 'jobid="4101"' in published[-1][1].text.decode()
    assert [e.renders for _, e in published] == [0, 0, 1]


def test_the_state_file_is_written_only_when_a_sample_changed_it(tmp_path: Path) -> None:
    node = SynthNode(tmp_path)
    node.add_job(4101, [5001])
    sampler, _ = _sampler(node, SourceErrors(), state_dir=node.state_dir)
    state_file = node.state_dir / "state.json"
    sampler.sample_once()
    first = state_file.stat()
    sampler.sample_once()  # nothing moved: same CPU time, same peak
    assert state_file.stat().st_ino == first.st_ino
    node.update_job(4101, cpu_seconds=12.5)
    sampler.sample_once()
    assert state_file.stat().st_ino != first.st_ino
    assert '"cpu_seconds":12.5' in state_file.read_text()


def test_cpu_energy_goes_to_the_jobs_by_their_cgroup_cpu_time(tmp_path: Path) -> None:
    node = SynthNode(tmp_path / "node")
    node.add_job(4101, [5001])
    node.add_job(4102, [5002])
    node.update_job(4101, cpu_seconds=0.0)
    node.update_job(4102, cpu_seconds=0.0)
    tree = PowercapTree(tmp_path / "powercap", sockets=1)
    busy = [0.0]
    errors = SourceErrors()
    source = CpuEnergySource(PowercapReader(tree.root), node.proc_root, errors,
                             busy=lambda _root: busy[0])
    sampler, published = _sampler(node, errors, cpu_energy=source)
    sampler.sample_once()
    node.update_job(4101, cpu_seconds=30.0)
    node.update_job(4102, cpu_seconds=10.0)
    busy[0] = 50.0
    tree.set("intel-rapl:0", 1_000_000_000)
    tree.set("intel-rapl:0:0", 100_000_000)
    sampler.sample_once()
    text = published[-1][1].text.decode()
    jobs = {(labels["jobid"], labels["domain"]): value for labels, value in
            series(text, "slurm_job_cpu_energy_joules_total")}
    assert jobs == pytest.approx({("4101", "package"): 600.0, ("4101", "dram"): 60.0,
                                  ("4102", "package"): 200.0, ("4102", "dram"): 20.0})
    outside = dict((labels["domain"], value) for labels, value in
                   series(text, "slurm_cpu_outside_jobs_energy_joules_total"))
    assert outside == pytest.approx({"package": 200.0, "dram": 20.0})
    assert _source_up(published[-1][1])["powercap"] == 1


def test_only_the_gpus_sample_cursors_may_wait_and_for_half_the_buffer_span(
        tmp_path: Path) -> None:
    node = SynthNode(tmp_path)
    errors = SourceErrors()
    gpu = GpuSampler(NoLibrary(), node.proc_root, errors)
    sampler, _ = _sampler(node, errors, gpu=gpu)
    every: list[float | None] = [5.0]
    gpu.buffer_read_interval = lambda: every[0]  # type: ignore[method-assign]
    data = {"jobs": {"1": 2}, "gpu": {"sample_cursors": {"g": 7}, "busy": {"g": 1.5}}}
    assert sampler._lazy_state(data) == (("gpu", "sample_cursors"), 10.0)
    every[0] = None  # no sample buffers
    assert sampler._lazy_state(data) == (None, 0.0)
    without_gpu, _ = _sampler(node, errors)
    assert without_gpu._lazy_state(data) == (None, 0.0)
