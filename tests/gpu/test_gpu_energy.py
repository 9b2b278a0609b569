"""GPU energy across restarts of the agent: the readings kept in the state dir
(gpu/attribution/energy.py) and the gap they credit to the jobs that held the GPU
(gpu/source.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu_exporter.gpu.attribution.energy import EnergyCounters, EnergyDelta, energy_delta_j
from slurm_gpu_exporter.gpu.attribution.shares import energy_shares
from slurm_gpu_exporter.gpu.readings import DeviceReading, GpuProcess
from slurm_gpu_exporter.gpu.source import GpuPartResult, GpuSampler
from slurm_gpu_exporter.jobs.job import Job
from slurm_gpu_exporter.node.source_health import SourceErrors
from slurm_gpu_exporter.node.state_dir import STATE_VERSION, StateStore
from tests.gpu.fake_gpu import T0, FakeBackend, StubMapper
from tests.gpu.test_state_cursors import boot


def reading(energy_mj: int | None, uuid: str = "GPU-a",
            failed: frozenset[str] = frozenset()) -> DeviceReading:
    return DeviceReading(index=0, uuid=uuid, name="fake", minor=0, pci_bus_id="",
                         energy_mj=energy_mj, failed=failed)


# --------------------------------------------------------------- the counter


def test_energy_counts_deltas_and_a_failed_read_keeps_the_last_good_value() -> None:
    energy = EnergyCounters()
    assert energy.delta(reading(10_000), 1.0).joules == 0.0  # first look
    assert energy.delta(reading(13_000), 2.0).joules == pytest.approx(3.0)
    failed = reading(None, failed=frozenset({"energy"}))
    assert energy.delta(failed, 3.0).joules == 0.0
    assert energy.exported_mj(failed) == 13_000  # exported: the last good value
    assert energy.delta(reading(20_000), 4.0).joules == pytest.approx(7.0)
    assert energy.delta(reading(None), 5.0).joules is None  # not supported


def test_an_energy_counter_that_goes_back_counts_nothing() -> None:
    assert energy_delta_j(None, 5_000) == 0.0
    assert energy_delta_j(9_000, 5_000) == 0.0  # the driver reloaded
    assert energy_delta_j(5_000, 9_500) == pytest.approx(4.5)


def saved_by(energy: EnergyCounters, boot_id: str | None = "boot-1") -> dict:
    return energy.export_state(boot_id)


def test_the_first_reading_after_a_restart_counts_from_the_saved_one() -> None:
    before = EnergyCounters()
    before.driver_seen("550.54.15")
    before.delta(reading(5_000_000), 100.0)
    before.hold("GPU-a", True)
    saved = saved_by(before)
    assert saved == {"energy_readings": {"boot_id": "boot-1", "driver": "550.54.15",
                                         "gpus": {"GPU-a": [5_000_000, 100.0]}}}
    after = EnergyCounters()
    after.import_state(saved, "boot-1")
    after.driver_seen("550.54.15")
    got = after.delta(reading(5_600_000), 130.0)
    assert got.joules == pytest.approx(600.0) and got.gap_from == 100.0
    assert after.delta(reading(5_700_000), 131.0).gap_from is None  # only the first


def test_a_counter_below_the_saved_reading_counts_from_the_new_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    after = EnergyCounters()
    after.import_state({"energy_readings": {"boot_id": None, "driver": "550.54.15",
                                            "gpus": {"GPU-a": [5_000_000, 100.0]}}}, None)
    after.driver_seen("550.54.15")
    with caplog.at_level(logging.WARNING):
        got = after.delta(reading(1_000_000), 130.0)  # reloaded: neither -4 kJ nor +1 kJ
    assert got.joules == 0.0 and got.gap_from is None
    assert "went back" in caplog.text
    assert after.delta(reading(1_000_500), 131.0).joules == pytest.approx(0.5)


@pytest.mark.parametrize(("boot_id", "driver"), [("boot-2", "550.54.15"),
                                                 ("boot-1", "560.35.03")])
def test_readings_of_another_boot_or_driver_are_dropped(boot_id: str, driver: str) -> None:
    saved = {"energy_readings": {"boot_id": "boot-1", "driver": "550.54.15",
                                 "gpus": {"GPU-a": [5_000_000, 100.0]}}}
    after = EnergyCounters()
    after.import_state(saved, boot_id)
    after.driver_seen(driver)
    assert after.delta(reading(9_000_000), 130.0) == EnergyDelta(0.0)


def test_only_readings_of_held_gpus_are_saved_and_unused_restored_ones_are_kept() -> None:
    energy = EnergyCounters()
    energy.import_state({"energy_readings": {"boot_id": "b", "driver": "d", "gpus": {
        "GPU-b": [7, 50.0], "GPU-bad": ["x", 1], "GPU-neg": [-1, 1.0], "GPU-f": [1.5, 1.0],
        "GPU-short": [3]}}}, "b")
    assert set(energy.restored) == {"GPU-b"}
    energy.delta(reading(10, "GPU-a"), 100.0)  # idle, no job holds it: not saved
    energy.hold("GPU-a", False)
    assert saved_by(energy, "b")["energy_readings"] == {
        "boot_id": "b", "driver": "d", "gpus": {"GPU-b": [7, 50.0]}}  # not read yet
    energy.prune({"GPU-a"})
    assert saved_by(energy, "b")["energy_readings"]["gpus"] == {}


def test_energy_of_a_gap_goes_only_to_the_jobs_that_held_the_gpu_across_it() -> None:
    busy = {"7": 0.5, "8": 0.25, "": 0.25}
    assert energy_shares(busy, 1.0, ["7", "8"]) == {"7": 0.5, "8": 0.25}
    assert energy_shares(busy, 1.0, ["7", "8"], only={"7"}) == {"7": 0.5}
    assert energy_shares({}, 0.0, ["7", "8"], only={"7"}) == {"7": 1.0}  # idle: evenly
    assert energy_shares({}, 0.0, ["7", "8"], only=set()) == {}


# -------------------------------------------------- the sampler across restarts


def job(jobid: str = "7", start: float = T0 - 60.0) -> Job:
    return Job(jobid=jobid, uid=1000, user="alice", job_gpus="0", start_time=start)


@pytest.fixture
def agents() -> Iterator[list[GpuSampler]]:
    """GpuSamplers started one after another on the same node (close them all)."""
    started: list[GpuSampler] = []
    yield started
    for s in started:
        s.close()


def start(agents: list[GpuSampler], backend: FakeBackend, proc_root: Path,
          saved: dict | None = None, jobs_of: dict[int, str] | None = None) -> GpuSampler:
    s = GpuSampler(backend, proc_root, SourceErrors(), clock=lambda: backend.t)
    s.mapper = StubMapper(jobs_of or {})  # type: ignore[assignment]
    if saved is not None:
        s.import_state(saved)
    agents.append(s)
    return s


def energy_of(part: GpuPartResult, jobid: str = "7") -> float | None:
    [found] = [s for s in part.job_gpus if s.jobid == jobid]
    return found.energy_joules


def allocated_of(part: GpuPartResult, jobid: str = "7") -> float:
    [found] = [s for s in part.job_gpus if s.jobid == jobid]
    return found.allocated_seconds


def unknown_of(part: GpuPartResult, jobid: str = "7") -> float:
    [found] = [s for s in part.job_gpus if s.jobid == jobid]
    return found.unknown_seconds or 0.0


def run_then_kill(s: GpuSampler, backend: FakeBackend, jobs: list[Job],
                  polls: int = 3) -> tuple[GpuPartResult, dict]:
    part = s.sample(jobs, backend.t)
    for _ in range(polls - 1):
        backend.advance(1.0)
        part = s.sample(jobs, backend.t)
    return part, s.export_state()  # the last state saved before the SIGKILL


def test_a_restart_credits_the_energy_used_while_down_to_the_job_holding_the_gpu(
    agents: list[GpuSampler], backend: FakeBackend, tmp_path: Path,
) -> None:
    jobs = [job()]
    last, saved = run_then_kill(start(agents, backend, tmp_path), backend, jobs)
    assert energy_of(last) == pytest.approx(200.0)  # 100 W for 2 s
    backend.advance(30.0)  # down for 30 s at 100 W
    part = start(agents, backend, tmp_path, saved).sample(jobs, backend.t)
    # The 30 s down were held: allocated where the restored cursor still found samples,
    # unknown where they may have been lost.
    assert allocated_of(part) + unknown_of(part) - allocated_of(last) == pytest.approx(30.0)
    assert unknown_of(part) > 0
    assert energy_of(part) == pytest.approx(200.0 + 3_000.0)


def test_a_driver_reload_while_down_neither_counts_negative_nor_the_new_counter(
    agents: list[GpuSampler], backend: FakeBackend, tmp_path: Path,
) -> None:
    jobs = [job()]
    last, saved = run_then_kill(start(agents, backend, tmp_path), backend, jobs)
    backend.advance(30.0)
    backend.energy_mj = 1_000_000  # reloaded: restarted lower (5,000 J less, 1,000 J in all)
    again = start(agents, backend, tmp_path, saved)
    part = again.sample(jobs, backend.t)
    assert energy_of(part) == pytest.approx(energy_of(last))
    backend.advance(1.0)
    assert energy_of(again.sample(jobs, backend.t)) == pytest.approx(energy_of(last) + 100.0)


def test_a_restart_in_another_boot_counts_from_the_new_reading(
    agents: list[GpuSampler], backend: FakeBackend, tmp_path: Path,
) -> None:
    boot(tmp_path, "boot-1")
    jobs = [job()]
    last, saved = run_then_kill(start(agents, backend, tmp_path), backend, jobs)
    boot(tmp_path, "boot-2")
    backend.advance(30.0)  # the counter went on (it need not go back after a reboot)
    part = start(agents, backend, tmp_path, saved).sample(jobs, backend.t)
    assert energy_of(part) == pytest.approx(energy_of(last))


@pytest.mark.parametrize(("percent", "share"), [(50.0, 1 / 3), (0.0, 1 / 2)])
def test_a_shared_gpu_splits_the_gap_by_busy_share_among_the_jobs_held_across_it(
    agents: list[GpuSampler], backend: FakeBackend, tmp_path: Path, percent: float,
    share: float,
) -> None:
    backend.percent = percent
    backend.processes = (GpuProcess(71, 0), GpuProcess(81, 0))
    owners = {71: "7", 81: "8"}
    jobs = [job("7"), job("8")]
    last, saved = run_then_kill(start(agents, backend, tmp_path, jobs_of=owners), backend,
                                jobs)
    backend.advance(30.0)  # 3,000 J; job 9 starts on the GPU while the agent is down
    backend.processes += (GpuProcess(91, 0),)
    jobs_now = [*jobs, job("9", start=backend.t - 10.0)]
    again = start(agents, backend, tmp_path, saved, jobs_of={**owners, 91: "9"})
    part = again.sample(jobs_now, backend.t)
    # Busy: by busy share (no process samples: evenly among the three jobs using it),
    # job 9's part of the gap is in nobody's allocated time and goes to no job. Idle:
    # evenly among the two jobs that held the GPU across the gap.
    for jobid in ("7", "8"):
        assert energy_of(part, jobid) == pytest.approx(energy_of(last, jobid) + 3_000 * share)
    assert energy_of(part, "9") == 0.0


def test_the_state_file_keeps_its_version_and_a_previous_agents_state_still_loads(
    agents: list[GpuSampler], backend: FakeBackend, tmp_path: Path,
) -> None:
    jobs = [job()]
    _, saved = run_then_kill(start(agents, backend, tmp_path), backend, jobs)
    store = StateStore(tmp_path / "state")
    store.save({"jobs": {}, "gpu": saved})
    loaded = store.load()
    assert loaded["version"] == STATE_VERSION == 1  # the previous agent reads version 1
    assert isinstance(loaded["gpu"]["energy_readings"], dict)  # a key it skips
    # A state without the key (the previous agent's): the first reading counts 0, as before.
    previous = {k: v for k, v in loaded["gpu"].items() if k != "energy_readings"}
    backend.advance(30.0)
    part = start(agents, backend, tmp_path, previous).sample(jobs, backend.t)
    assert energy_of(part) == pytest.approx(200.0)
