"""CPU package and DRAM energy from synthetic powercap trees, shared among jobs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from slurm_gpu_exporter.exposition.snapshot import JobInfo, JobSample
from slurm_gpu_exporter.jobs.cpu_energy import CpuEnergySource, EnergySharer
from slurm_gpu_exporter.node.powercap import (
    PowercapReader,
    busy_cpu_seconds,
    discover,
    wrapped_delta,
)
from slurm_gpu_exporter.node.source_health import SourceErrors
from tests.support.powercap import PowercapTree as Tree


class Clock:
    """A node whose busy CPU seconds the test sets."""

    def __init__(self) -> None:
        self.busy = 0.0

    def __call__(self, _root: Path) -> float:
        return self.busy


def _job(jobid: str) -> JobInfo:
    return JobInfo(jobid=jobid, user="alice", start_time=1000.0)


def _samples(cpu: dict[str, float]) -> list[JobSample]:
    return [JobSample(job=_job(j), cpu_seconds=c) for j, c in cpu.items()]


def _totals(part) -> tuple[dict[str, float], float, float]:  # type: ignore[no-untyped-def]
    jobs: dict[str, float] = {}
    for s in part.jobs:
        jobs[s.job.jobid] = jobs.get(s.job.jobid, 0.0) + s.joules
    measured = sum(c.joules for c in part.sockets)
    outside = sum(j for _, j in part.outside_jobs)
    return jobs, measured, outside


def test_wrap_around_counts_the_energy_past_the_range() -> None:
    assert wrapped_delta(100, 300, 1000) == 200
    assert wrapped_delta(900, 50, 1000) == 150


def test_discovery_finds_package_and_dram_of_each_socket(tmp_path: Path) -> None:
    Tree(tmp_path)
    zones, problems = discover(tmp_path)
    assert problems == []
    assert sorted((z.socket, z.domain) for z in zones) == [
        ("0", "dram"), ("0", "package"), ("1", "dram"), ("1", "package")]


def test_three_jobs_and_outside_add_up_to_the_tree_energy_across_a_wrap(tmp_path: Path) -> None:
    tree = Tree(tmp_path, max_range=10_000_000_000)
    # socket 0's package starts near its range, so it wraps during the run
    tree.set("intel-rapl:0", 10_000_000_000 - 150_000_000)
    clock = Clock()
    errors = SourceErrors()
    source = CpuEnergySource(PowercapReader(tmp_path), tmp_path, errors, busy=clock)
    cpu = {"1": 0.0, "2": 0.0, "3": 0.0}
    assert source.sample(_samples(cpu)).up
    truth = 0
    for step in range(20):
        for zone, watts in (("intel-rapl:0", 180), ("intel-rapl:1", 120),
                            ("intel-rapl:0:0", 20), ("intel-rapl:1:0", 15)):
            uj = watts * 5_000_000
            tree.set(zone, (tree.get(zone) + uj) % 10_000_000_000)
            truth += uj
        cpu = {"1": cpu["1"] + 40.0, "2": cpu["2"] + 10.0 * (step % 3), "3": cpu["3"] + 2.5}
        clock.busy += 80.0  # the node: 16 CPUs busy of, say, 64
        part = source.sample(_samples(cpu))
    jobs, measured, outside = _totals(part)
    assert part.up and errors.snapshot()["powercap"] == 0
    assert measured == pytest.approx(truth / 1e6, rel=1e-9)
    assert sum(jobs.values()) + outside == pytest.approx(truth / 1e6, rel=0.005)
    assert jobs["1"] > jobs["2"] > jobs["3"] > 0 and outside > 0
    # job 1 used 40 of the 80 busy CPU seconds in each sample: half of the energy
    assert jobs["1"] == pytest.approx(measured / 2, rel=1e-6)


def test_a_missing_socket_leaves_the_others_counted(tmp_path: Path) -> None:
    tree = Tree(tmp_path, sockets=1)
    clock = Clock()
    source = CpuEnergySource(PowercapReader(tmp_path), tmp_path, SourceErrors(), busy=clock)
    source.sample(_samples({"1": 0.0, "2": 0.0, "3": 0.0}))
    tree.set("intel-rapl:0", 500_000_000)
    tree.set("intel-rapl:0:0", 50_000_000)
    clock.busy = 30.0
    part = source.sample(_samples({"1": 10.0, "2": 10.0, "3": 5.0}))
    jobs, measured, outside = _totals(part)
    assert part.up and {c.socket for c in part.sockets} == {"0"}
    assert measured == pytest.approx(550.0)
    assert sum(jobs.values()) + outside == pytest.approx(550.0, rel=0.005)
    assert outside == pytest.approx(550.0 * 5 / 30)


def test_an_unreadable_counter_reports_the_source_down_not_zero(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    errors = SourceErrors()
    source = CpuEnergySource(PowercapReader(tmp_path), tmp_path, errors, busy=Clock())
    source.sample([])
    # as root a mode does not stop a read; a directory in the file's place does
    os.unlink(tmp_path / "intel-rapl:1" / "energy_uj")
    (tmp_path / "intel-rapl:1" / "energy_uj").mkdir()
    tree.set("intel-rapl:0", 1_000_000)
    part = source.sample([])
    assert not part.up and errors.snapshot()["powercap"] == 1
    assert {(c.socket, c.domain) for c in part.sockets} == {("0", "package"), ("0", "dram"),
                                                            ("1", "dram")}


def test_no_zones_is_down_and_counted_once(tmp_path: Path) -> None:
    errors = SourceErrors()
    source = CpuEnergySource(PowercapReader(tmp_path / "absent"), tmp_path, errors,
                             busy=Clock())
    parts = [source.sample([]) for _ in range(150)]  # looks again every 60 samples
    assert not any(p.up for p in parts)
    assert parts[0].sockets == () and parts[0].jobs == ()
    assert errors.snapshot()["powercap"] == 1  # the same absence is counted once


def test_zones_that_appear_later_are_found_at_the_next_look(tmp_path: Path) -> None:
    errors = SourceErrors()
    source = CpuEnergySource(PowercapReader(tmp_path / "pc"), tmp_path, errors, busy=Clock())
    assert not source.sample([]).up
    Tree(tmp_path / "pc")  # the module was loaded since
    parts = [source.sample([]) for _ in range(60)]
    assert not parts[0].up and parts[-1].up and len(parts[-1].sockets) == 0  # first read
    assert source.sample([]).sockets  # then counted from the second
    assert errors.snapshot()["powercap"] == 1


def test_jobs_using_more_than_the_node_counted_busy_share_all_of_it() -> None:
    sharer = EnergySharer()
    sharer.share({"package": 100.0}, {("1", 0.0): 30.0, ("2", 0.0): 10.0}, busy_seconds=20.0)
    assert sharer.jobs[("1", 0.0)]["package"] == pytest.approx(75.0)
    assert sharer.outside["package"] == pytest.approx(0.0)


def test_counters_survive_a_restart_through_the_state(tmp_path: Path) -> None:
    Tree(tmp_path)
    one = CpuEnergySource(PowercapReader(tmp_path), tmp_path, SourceErrors(), busy=Clock())
    one.sharer.jobs[("7", 1000.0)] = {"package": 12.5, "dram": 1.5}
    two = CpuEnergySource(PowercapReader(tmp_path), tmp_path, SourceErrors(), busy=Clock())
    two.import_state(one.export_state())
    part = two.sample(_samples({"7": 3.0}))
    assert {s.domain: s.joules for s in part.jobs} == {"package": 12.5, "dram": 1.5}


def test_busy_cpu_seconds_leaves_out_idle_and_iowait(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu  100 10 50 1000 40 5 5 0 0 0\ncpu0 1 2 3\n")
    assert busy_cpu_seconds(tmp_path, user_hz=100) == pytest.approx(1.7)


REAL = Path("/sys/class/powercap")


@pytest.mark.skipif(not any(REAL.glob("*rapl:*")), reason="this machine shows no RAPL zones")
def test_the_real_powercap_tree_reads_and_adds_up() -> None:
    reader = PowercapReader(REAL)
    problems = reader.rediscover()
    if not reader.zones:
        pytest.skip(f"no readable RAPL zone: {problems}")
    reader.read()
    time.sleep(0.5)
    readings = reader.read()
    if any(r.error for r in readings):
        pytest.skip("energy_uj is root-only here: " + readings[0].error)
    source = CpuEnergySource(reader, Path("/proc"), SourceErrors())
    source.sample([])
    time.sleep(0.5)
    part = source.sample([])
    measured = sum(c.joules for c in part.sockets)
    assert part.up and measured > 0
    assert sum(j for _, j in part.outside_jobs) == pytest.approx(measured, rel=1e-9)
