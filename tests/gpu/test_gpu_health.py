"""What slowed a job's GPU and what hit it: the cumulative-counter bookkeeping
(gpu/attribution/cumulative.py), throttled seconds and error counts per job
(gpu/attribution/throttle.py, gpu/attribution/job_errors.py) through the GPU sampler,
across restarts of the agent."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu_exporter.exposition.gpu_metrics import health_families
from slurm_gpu_exporter.exposition.snapshot import Snapshot
from slurm_gpu_exporter.gpu.attribution.cumulative import CumulativeReadings
from slurm_gpu_exporter.gpu.attribution.throttle import ThrottleBook
from slurm_gpu_exporter.gpu.readings import DeviceReading, HealthReading
from slurm_gpu_exporter.gpu.source import GpuPartResult, GpuSampler
from slurm_gpu_exporter.jobs.job import Job
from slurm_gpu_exporter.node.source_health import SourceErrors
from tests.gpu.fake_gpu import T0, FakeBackend, StubMapper

# ------------------------------------------------------------ the bookkeeping


def test_deltas_count_from_the_second_reading_and_a_missing_value_keeps_the_last() -> None:
    book = CumulativeReadings("k", "test counters")
    assert book.delta("GPU-a", {"power": 100}, 1.0).values == {"power": 0}  # first look
    assert book.delta("GPU-a", {"power": 350, "thermal": 5}, 2.0).values == {
        "power": 250, "thermal": 0}  # a counter seen for the first time counts 0
    assert book.delta("GPU-a", {"thermal": 9}, 3.0).values == {"thermal": 4}  # power failed
    assert book.delta("GPU-a", {"power": 400}, 4.0).values == {"power": 50}  # caught up


def test_a_counter_that_went_back_counts_from_its_new_value(
    caplog: pytest.LogCaptureFixture,
) -> None:
    book = CumulativeReadings("k", "test counters")
    book.delta("GPU-a", {"power": 1000}, 1.0)
    with caplog.at_level(logging.INFO):
        assert book.delta("GPU-a", {"power": 10}, 2.0).values == {"power": 0}
    assert "went back" in caplog.text
    assert book.delta("GPU-a", {"power": 30}, 3.0).values == {"power": 20}


def test_a_saved_reading_counts_the_gap_once_for_the_same_boot_and_driver() -> None:
    before = CumulativeReadings("k", "test counters")
    before.driver_seen("550")
    before.delta("GPU-a", {"power": 1000}, 100.0)
    before.delta("GPU-b", {"power": 7}, 100.0)
    before.hold("GPU-a", True)  # only held GPUs are saved
    saved = before.export_state("boot-1")
    assert saved["k"]["gpus"] == {"GPU-a": [{"power": 1000}, 100.0]}
    after = CumulativeReadings("k", "test counters")
    after.import_state(saved, "boot-1")
    after.driver_seen("550")
    got = after.delta("GPU-a", {"power": 4000}, 130.0)
    assert got.values == {"power": 3000} and got.gap_from == 100.0
    assert after.delta("GPU-a", {"power": 4000}, 131.0).gap_from is None
    for boot_id, driver in (("boot-2", "550"), ("boot-1", "560")):
        other = CumulativeReadings("k", "test counters")
        other.import_state(saved, boot_id)
        other.driver_seen(driver)
        assert other.delta("GPU-a", {"power": 4000}, 130.0).values == {"power": 0}


def test_without_violation_counters_the_current_reasons_are_sampled() -> None:
    book = ThrottleBook()

    def polled(reasons: int, supported: int | None = 0x4 | 0x20) -> DeviceReading:
        return DeviceReading(index=0, uuid="GPU-a", name="", minor=0, pci_bus_id="",
                             health=HealthReading(clocks_event_reasons=reasons,
                                                  clocks_event_reasons_supported=supported))

    zero = {"power": 0.0, "thermal": 0.0, "app_clocks": 0.0}  # the supported reasons
    assert book.interval(polled(0x4), 10.0).seconds == zero
    assert book.interval(polled(0x4), 15.0).seconds == {**zero, "power": 5.0, "app_clocks": 5.0}
    assert book.interval(polled(0x0), 20.0).seconds == zero
    assert book.interval(polled(0x40), 22.0).seconds == {**zero, "thermal": 2.0,
                                                         "app_clocks": 2.0}  # HW thermal
    assert dict(book.device_seconds("GPU-a")) == {"power": 5.0, "thermal": 2.0,
                                                  "app_clocks": 7.0}
    assert ThrottleBook().interval(polled(0x4, None), 1.0).seconds == {}  # no mask: none


# -------------------------------------------------------- through the sampler


def job(jobid: str = "7", start: float = T0 - 60.0, gpus: str = "0") -> Job:
    return Job(jobid=jobid, uid=1000, user="alice", job_gpus=gpus, start_time=start)


@pytest.fixture
def backend() -> FakeBackend:
    b = FakeBackend()
    b.violations_ns = {"power": 5_000_000_000, "thermal": 0}  # sync boost &c.: unsupported
    b.throttling = {"power": 0.4}
    b.error_counters = {"pcie_replays": 3, "remapped_rows:correctable": 0}
    b.ecc_corrected = 10
    return b


@pytest.fixture
def agents() -> Iterator[list[GpuSampler]]:
    started: list[GpuSampler] = []
    yield started
    for s in started:
        s.close()


def start(agents: list[GpuSampler], backend: FakeBackend, proc_root: Path,
          saved: dict | None = None) -> GpuSampler:
    s = GpuSampler(backend, proc_root, SourceErrors(), clock=lambda: backend.t)
    s.mapper = StubMapper({})  # type: ignore[assignment]
    if saved is not None:
        s.import_state(saved)
    agents.append(s)
    return s


def health_of(part: GpuPartResult, jobid: str = "7") -> dict[str, float]:
    found = [s for s in part.job_gpus if s.jobid == jobid]
    return dict(found[0].health) if found else {}


def run(s: GpuSampler, backend: FakeBackend, jobs: list[Job], polls: int) -> GpuPartResult:
    part = s.sample(jobs, backend.t)
    for _ in range(polls):
        backend.advance(1.0)
        part = s.sample(jobs, backend.t)
    return part


def test_a_job_gets_the_throttled_time_while_it_held_the_gpu_by_reason(
    agents: list[GpuSampler], backend: FakeBackend, tmp_path: Path,
) -> None:
    part = run(start(agents, backend, tmp_path), backend, [job()], polls=10)
    health = health_of(part)
    assert health["throttle:power"] == pytest.approx(4.0)  # 40 % of 10 s
    assert health["throttle:thermal"] == 0.0  # supported, never active: a series at 0
    assert "throttle:sync_boost" not in health  # not supported: no series
    [gpu] = part.gpus
    assert dict(gpu.throttled_seconds) == {"power": pytest.approx(9.0), "thermal": 0.0}
    assert gpu.sm_clock_hz == gpu.sm_clock_max_hz == 1980e6


def test_two_jobs_on_one_gpu_each_get_all_of_its_throttled_time_and_the_next_job_none(
    agents: list[GpuSampler], backend: FakeBackend, tmp_path: Path,
) -> None:
    s = start(agents, backend, tmp_path)
    both = [job("7"), job("8")]
    part = run(s, backend, both, polls=5)
    assert health_of(part, "7")["throttle:power"] == pytest.approx(2.0)
    assert health_of(part, "8")["throttle:power"] == pytest.approx(2.0)
    backend.throttling = {}
    later = [job("9", start=backend.t)]
    part = run(s, backend, later, polls=5)
    assert health_of(part, "9")["throttle:power"] == 0.0


def test_device_errors_while_a_job_held_the_gpu_are_its_own(
    agents: list[GpuSampler], backend: FakeBackend, tmp_path: Path,
) -> None:
    s = start(agents, backend, tmp_path)
    part = run(s, backend, [job()], polls=1)
    assert health_of(part)["pcie_replays"] == 0  # the counter's past is nobody's
    backend.error_counters["pcie_replays"] += 4
    backend.error_counters["remapped_rows:correctable"] += 1
    backend.ecc_corrected = 12
    part = run(s, backend, [job()], polls=1)
    health = health_of(part)
    assert (health["pcie_replays"], health["remapped_rows:correctable"],
            health["ecc:corrected"]) == (4, 1, 2)
    assert "ecc:uncorrected" not in health  # the GPU does not count it
    assert dict(part.gpus[0].error_counters) == {"pcie_replays": 7,
                                                  "remapped_rows:correctable": 1}
    # Another job on another GPU gets none of it.
    part = run(s, backend, [job(), job("8", gpus="1")], polls=1)
    assert health_of(part, "8") == {}


def test_an_xid_goes_to_the_job_holding_the_gpu_and_not_to_a_job_started_after_it(
    agents: list[GpuSampler], backend: FakeBackend, tmp_path: Path,
) -> None:
    s = start(agents, backend, tmp_path)
    run(s, backend, [job()], polls=1)
    s.link.xids.add(backend.uuid, 79, at=backend.t)
    newer = job("8", start=backend.t + 0.5)  # started after the event, before the poll
    backend.advance(1.0)
    part = s.sample([job(), newer], backend.t)
    assert health_of(part)["xid:79"] == 1
    assert "xid:79" not in health_of(part, "8")
    [sample] = [j for j in part.job_gpus if j.jobid == "7"]
    assert sample.xid_last_seen == ((79, backend.t - 1.0),)
    assert health_of(run(s, backend, [job(), newer], polls=1))["xid:79"] == 1  # once


def test_a_restart_keeps_the_counters_and_counts_the_time_down_for_the_job_held_across(
    agents: list[GpuSampler], backend: FakeBackend, tmp_path: Path,
) -> None:
    s = start(agents, backend, tmp_path)
    run(s, backend, [job()], polls=5)
    saved = s.export_state()
    backend.advance(30.0)  # down for 30 s, throttled 40 % of it
    newcomer = job("8", start=backend.t - 10.0)  # started while the agent was down
    again = start(agents, backend, tmp_path, saved)
    part = again.sample([job(), newcomer], backend.t)
    assert health_of(part)["throttle:power"] == pytest.approx(2.0 + 12.0)
    assert health_of(part, "8")["throttle:power"] == 0.0  # not held across the gap


def test_throttle_and_error_families_only_where_a_gpu_has_them(
    agents: list[GpuSampler], backend: FakeBackend, tmp_path: Path,
) -> None:
    part = run(start(agents, backend, tmp_path), backend, [job()], polls=2)
    names = {f.name for f in health_families(Snapshot(0.0, job_gpus=part.job_gpus,
                                                        gpus=part.gpus))}
    assert names == {"slurm_job_gpu_throttled_seconds", "slurm_job_gpu_ecc_errors",
                     "slurm_job_gpu_remapped_rows", "slurm_job_gpu_pcie_replays",
                     "slurm_gpu_throttled_seconds", "slurm_gpu_remapped_rows",
                     "slurm_gpu_pcie_replays", "slurm_gpu_sm_clock_hertz",
                     "slurm_gpu_sm_clock_max_hertz"}
    assert list(health_families(Snapshot(0.0))) == []


def test_the_reasons_and_counters_are_nvmls_own_numbers() -> None:
    """Each reason and counter read by the number nvidia-ml-py gives it (a swapped pair
    would count thermal time as power time, and only a real-process test would see it)."""
    import pynvml

    from slurm_gpu_exporter.gpu.nvml import health

    assert health.POLICIES == {
        "power": pynvml.NVML_PERF_POLICY_POWER, "thermal": pynvml.NVML_PERF_POLICY_THERMAL,
        "sync_boost": pynvml.NVML_PERF_POLICY_SYNC_BOOST,
        "board_limit": pynvml.NVML_PERF_POLICY_BOARD_LIMIT,
        "low_utilization": pynvml.NVML_PERF_POLICY_LOW_UTILIZATION,
        "reliability": pynvml.NVML_PERF_POLICY_RELIABILITY,
        "app_clocks": pynvml.NVML_PERF_POLICY_TOTAL_APP_CLOCKS,
        "base_clocks": pynvml.NVML_PERF_POLICY_TOTAL_BASE_CLOCKS}
    assert health.NVLINK_COUNTERS == {
        "replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
        "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
        "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
        "crc_data": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA}
    assert health.NVLINK_TOTAL_FIELDS == {
        "replay": pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
        "recovery": pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
        "crc_flit": pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        "crc_data": pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL}
