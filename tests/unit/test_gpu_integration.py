"""The pure arithmetic of GPU sampling (gpu/integration.py) on plain readings."""

from __future__ import annotations

import logging

import pytest

from slurm_gpu_exporter.gpu.backend import DeviceReading, ProcessUtilSample, UtilSample
from slurm_gpu_exporter.gpu.integration import DeviceIntegrator, energy_delta_j


def reading(samples: tuple[UtilSample, ...] | None = (), energy_mj: int | None = None,
            failed: frozenset[str] = frozenset(), uuid: str = "GPU-a",
            process_samples: tuple[ProcessUtilSample, ...] = ()) -> DeviceReading:
    return DeviceReading(index=0, uuid=uuid, name="fake", minor=0, pci_bus_id="",
                         energy_mj=energy_mj, util_samples=samples,
                         process_samples=process_samples, failed=failed)


def grid(first_s: float, n: int, percent: float) -> tuple[UtilSample, ...]:
    return tuple(UtilSample(int((first_s + 0.1 * i) * 1e6), percent) for i in range(n))


def test_the_first_look_only_sets_the_cursor_then_each_sample_counts_once() -> None:
    dev = DeviceIntegrator()
    assert dev.integrate(reading(grid(100.0, 5, 50.0))) == (0.0, 0.0)
    assert dev.cursors["GPU-a"] == (100_400_000, 0)
    window, busy = dev.integrate(reading(grid(100.5, 10, 50.0)))
    assert window == pytest.approx(1.0) and busy == pytest.approx(0.5)
    assert dev.integrate(reading(())) == (0.0, 0.0)  # nothing new
    assert dev.device_busy["GPU-a"] == pytest.approx(0.5)


def test_a_gpu_without_samples_has_no_window_and_keeps_its_process_cursor() -> None:
    dev = DeviceIntegrator()
    procs = (ProcessUtilSample(9, 5_000_000, 10.0),)
    assert dev.integrate(reading(None, process_samples=procs)) == (None, None)
    assert dev.cursors["GPU-a"] == (0, 5_000_000)


def test_energy_counts_deltas_and_a_failed_read_keeps_the_last_good_value() -> None:
    dev = DeviceIntegrator()
    assert dev.energy_delta(reading(energy_mj=10_000)) == 0.0  # first look
    assert dev.energy_delta(reading(energy_mj=13_000)) == pytest.approx(3.0)
    failed = reading(energy_mj=None, failed=frozenset({"energy"}))
    assert dev.energy_delta(failed) == 0.0
    assert dev.energy_mj(failed) == 13_000  # exported: the last good value
    assert dev.energy_delta(reading(energy_mj=20_000)) == pytest.approx(7.0)
    assert dev.energy_delta(reading(energy_mj=None)) is None  # not supported


def test_an_energy_counter_that_goes_back_counts_nothing() -> None:
    assert energy_delta_j(None, 5_000) == 0.0
    assert energy_delta_j(9_000, 5_000) == 0.0  # the driver reloaded
    assert energy_delta_j(5_000, 9_500) == pytest.approx(4.5)


def test_a_driver_on_another_clock_is_logged_once_per_gpu(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dev = DeviceIntegrator()
    now = 1_800_000_000.0
    assert dev.driver_clock_ok(reading(grid(now - 30, 3, 0.0)), now)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert not dev.driver_clock_ok(reading(grid(1000.0, 3, 0.0)), now)
    assert len(caplog.records) == 1


def test_state_round_trip_and_pruning_of_gpus_no_longer_present() -> None:
    dev = DeviceIntegrator()
    for uuid in ("GPU-a", "GPU-b"):
        dev.integrate(reading(grid(100.0, 3, 100.0), uuid=uuid))
        dev.integrate(reading(grid(100.3, 3, 100.0), uuid=uuid))
        dev.energy_delta(reading(energy_mj=1, uuid=uuid))
    dev.prune({"GPU-b"})
    assert set(dev.cursors) == set(dev.device_busy) == set(dev.last_energy) == {"GPU-b"}
    again = DeviceIntegrator()
    again.import_state({**dev.export_state(), "cursors": {**dev.export_state()["cursors"],
                                                          "GPU-bad": [1]}})
    assert again.cursors == dev.cursors and again.device_busy == dev.device_busy
