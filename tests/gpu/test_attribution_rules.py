"""Attribution's pure rules at their edges (weights below one, users without samples,
MIG slices past a GPU's), and what its counters say in the log and keep across a
restart: counters that went back, readings of another driver, a saved energy reading
of 0 mJ, throttle readings of this boot."""

from __future__ import annotations

import logging

import pytest

from slurm_gpu_exporter.gpu.attribution.cumulative import CumulativeReadings
from slurm_gpu_exporter.gpu.attribution.energy import EnergyCounters
from slurm_gpu_exporter.gpu.attribution.job_errors import HealthBook
from slurm_gpu_exporter.gpu.attribution.shares import (
    UNATTRIBUTED,
    mig_sm_fraction,
    shares,
    user_shares,
)
from slurm_gpu_exporter.gpu.readings import DeviceReading, HealthReading
from slurm_gpu_exporter.gpu.xids import XidCounts


def test_weights_below_one_still_split_by_weight() -> None:
    assert shares({"7": 0.75, "8": 0.0}, ["7", "8"]) == {"7": 1.0, "8": 0.0}
    assert shares({"7": 0.2, UNATTRIBUTED: 0.6}, ["7"]) == pytest.approx(
        {"7": 0.25, UNATTRIBUTED: 0.75})
    assert shares({"7": 0.0, "8": 0.0}, ["7", "8"]) == {"7": 0.5, "8": 0.5}


def test_users_outside_jobs_without_samples_get_none_of_a_split_by_samples() -> None:
    assert user_shares({"alice": 3.0}, ["alice", "bob"]) == {"alice": 1.0, "bob": 0.0}
    assert user_shares({}, ["alice", "bob"]) == {"alice": 0.5, "bob": 0.5}
    assert user_shares({"alice": 1.0, "bob": 3.0}, ["alice", "bob"]) == {
        "alice": 0.25, "bob": 0.75}


def test_a_mig_instance_never_has_more_than_the_whole_gpu() -> None:
    assert mig_sm_fraction("MIG 7g.80gb", "NVIDIA A30") == 1.0  # 7 slices of 4
    assert mig_sm_fraction("MIG 2g.12gb", "NVIDIA A30 24GB") == 0.5
    assert mig_sm_fraction("MIG 1c.3g.40gb", "NVIDIA H100 80GB HBM3") == pytest.approx(1 / 7)
    assert mig_sm_fraction("MIG 7g.80gb", "NVIDIA H100 80GB HBM3") == 1.0
    assert mig_sm_fraction("MIG instance", "NVIDIA H100") is None


def test_a_counter_that_went_back_is_logged_with_the_gpu_the_counter_and_both_values(
        caplog: pytest.LogCaptureFixture) -> None:
    book = HealthBook(XidCounts()).errors
    book.delta("GPU-a", {"pcie_replays": 50}, 1.0)
    with caplog.at_level(logging.INFO):
        assert book.delta("GPU-a", {"pcie_replays": 5}, 2.0).values == {"pcie_replays": 0}
    assert caplog.messages == [
        "GPU GPU-a: the GPU error counters counter pcie_replays went back from 50 to 5 "
        "(driver reload, GPU reset); it counts from there"]
    assert book.delta("GPU-a", {"pcie_replays": 5}, 3.0).values == {"pcie_replays": 0}


def test_readings_of_another_driver_are_dropped_with_a_line_naming_both(
        caplog: pytest.LogCaptureFixture) -> None:
    before = CumulativeReadings("k", "GPU error counters")
    before.driver_seen("550.1")
    before.delta("GPU-a", {"pcie_replays": 1}, 1.0)
    before.hold("GPU-a", True)
    after = CumulativeReadings("k", "GPU error counters")
    after.import_state(before.export_state("boot"), "boot")
    with caplog.at_level(logging.INFO):
        after.driver_seen("560.2")
    assert caplog.messages == [
        "the saved GPU error counters are of driver 550.1, not 560.2; they count from "
        "each GPU's first reading"]
    assert after.restored == {}


def test_energy_readings_of_another_driver_are_dropped_with_a_line_naming_both(
        caplog: pytest.LogCaptureFixture) -> None:
    energy = EnergyCounters()
    energy.import_state({"energy_readings": {"boot_id": "b", "driver": "550.1",
                                             "gpus": {"GPU-a": [1000, 5.0]}}}, "b")
    with caplog.at_level(logging.INFO):
        energy.driver_seen("560.2")
    assert caplog.messages == [
        "the saved GPU energy readings are of driver 550.1, not 560.2; each GPU's energy "
        "counts from its first reading"]
    assert energy.restored == {}


def test_saved_readings_of_another_boot_are_dropped_with_a_line_saying_what_follows(
        caplog: pytest.LogCaptureFixture) -> None:
    book = HealthBook(XidCounts())
    energy = EnergyCounters()
    saved = {"throttle_readings": {"boot_id": "b1", "driver": None,
                                   "gpus": {"GPU-a": [{"power": 5}, 1.0]}},
             "error_readings": {"boot_id": "b1", "driver": None,
                                "gpus": {"GPU-a": [{"pcie_replays": 5}, 1.0]}},
             "energy_readings": {"boot_id": "b1", "driver": None,
                                 "gpus": {"GPU-a": [1000, 1.0]}}}
    with caplog.at_level(logging.INFO):
        book.import_state(saved, "b2")
        energy.import_state(saved, "b2")
    assert caplog.messages == [
        "the GPU throttle counters in the state dir are from another boot; they are "
        "dropped and they count from each GPU's first reading",
        "the GPU error counters in the state dir are from another boot; they are dropped "
        "and they count from each GPU's first reading",
        "the GPU energy readings in the state dir are from another boot; they are dropped "
        "and each GPU's energy counts from its first reading"]
    assert book.throttle.readings.restored == {} and energy.restored == {}


def test_throttle_and_error_readings_saved_in_this_boot_come_back() -> None:
    book = HealthBook(XidCounts())
    reading = DeviceReading(0, "GPU-a", "x", 0, "", health=HealthReading(
        violations_ns=(("power", 2_000_000_000),), counters=(("pcie_replays", 4),)))
    book.interval(reading, 100.0)
    book.hold("GPU-a", True)
    saved = book.export_state("b1")
    again = HealthBook(XidCounts())
    again.import_state(saved, "b1")
    later = DeviceReading(0, "GPU-a", "x", 0, "", health=HealthReading(
        violations_ns=(("power", 5_000_000_000),), counters=(("pcie_replays", 6),)))
    delta = again.interval(later, 160.0)
    assert delta.throttled == {"power": 3.0} and delta.errors == {"pcie_replays": 2}
    assert delta.gap_from == 100.0


def test_a_saved_energy_reading_of_zero_counts_the_gap_from_zero(
        caplog: pytest.LogCaptureFixture) -> None:
    energy = EnergyCounters()
    energy.import_state({"energy_readings": {"boot_id": "b", "driver": None,
                                             "gpus": {"GPU-a": [0, 5.0],
                                                      "GPU-b": [-1, 5.0]}}}, "b")
    assert set(energy.restored) == {"GPU-a"}
    got = energy.delta(DeviceReading(0, "GPU-a", "x", 0, "", energy_mj=2500), 9.0)
    assert (got.joules, got.gap_from) == (2.5, 5.0)


def test_an_energy_counter_below_its_saved_reading_is_logged_and_counts_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    energy = EnergyCounters()
    energy.import_state({"energy_readings": {"boot_id": "b", "driver": None,
                                             "gpus": {"GPU-a": [9000, 5.0]}}}, "b")
    with caplog.at_level(logging.INFO):
        got = energy.delta(DeviceReading(3, "GPU-a", "x", 0, "", energy_mj=2500), 9.0)
    assert (got.joules, got.gap_from) == (0.0, None)
    assert caplog.messages == [
        "GPU 3 (GPU-a): the driver's energy counter went back from 9000 to 2500 mJ while "
        "the agent was down (a driver reload or GPU reset); its energy counts from this "
        "reading, the time down is not counted"]
