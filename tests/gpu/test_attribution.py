"""Pure attribution rules: which GPUs a job holds, and how busy time and energy are split."""

from __future__ import annotations

import pytest

from slurm_gpu_exporter.gpu.attribution.shares import (
    UNATTRIBUTED,
    GpuTarget,
    energy_shares,
    held_targets,
    shares,
)
from slurm_gpu_exporter.gpu.driver.gaps import integrate_samples
from slurm_gpu_exporter.gpu.readings import UtilSample
from slurm_gpu_exporter.model.allocation import GpuAllocation, gpu_allocation, parse_index_list

# NVML order 0..3, but minor numbers (= Slurm's gres indices) reversed.
TARGETS = [GpuTarget(str(i), f"GPU-{i}", minor=3 - i) for i in range(4)]


def test_slurm_indices_are_matched_by_minor_number_not_nvml_order() -> None:
    held = held_targets(gpu_allocation("0,1", ""), TARGETS)
    assert [t.gpu for t in held] == ["2", "3"]


def test_uuids_in_cuda_visible_devices_win_over_indices() -> None:
    held = held_targets(gpu_allocation("0", "GPU-1,GPU-2"), TARGETS)
    assert [t.uuid for t in held] == ["GPU-1", "GPU-2"]


def test_mig_instances_are_held_by_uuid_only() -> None:
    mig = GpuTarget("0.1", "MIG-a", minor=None, is_mig=True, parent_uuid="GPU-0")
    assert held_targets(gpu_allocation("", "MIG-a"), [*TARGETS, mig]) == [mig]
    assert mig not in held_targets(gpu_allocation("0", ""), [*TARGETS, mig])


@pytest.mark.parametrize(("text", "expected"), [("0,2-3", [0, 2, 3]), ("", []), ("1", [1]),
                                                ("0-", []), ("a,b", []), ("3-1", []),
                                                ("²", []), ("1,٣", []), ("0-1024", []),
                                                (" 0 , 1 ", [0, 1]), ("0,,1", [0, 1]),
                                                ("0-1023," * 2, [])])
def test_index_lists(text: str, expected: list[int]) -> None:
    assert parse_index_list(text) == expected


def test_no_devfiles_means_no_gpus() -> None:
    assert gpu_allocation("", "NoDevFiles") == GpuAllocation()


def test_one_user_gets_all_the_busy_time() -> None:
    assert shares({"7": 12.0}, ["7"]) == {"7": 1.0}


def test_shared_gpu_splits_by_process_samples() -> None:
    split = shares({"7": 30.0, "8": 50.0}, ["7", "8"])
    assert split == pytest.approx({"7": 0.375, "8": 0.625})
    assert sum(split.values()) == pytest.approx(1.0)


def test_shared_gpu_without_samples_splits_evenly() -> None:
    assert shares({"7": 0.0, "8": 0.0}, ["7", "8"]) == {"7": 0.5, "8": 0.5}


def test_processes_outside_jobs_take_their_share() -> None:
    split = shares({"7": 10.0, UNATTRIBUTED: 30.0}, ["7"])
    assert split == pytest.approx({"7": 0.25, UNATTRIBUTED: 0.75})


def test_busy_without_processes_goes_to_the_sole_holder_else_nobody() -> None:
    assert shares({}, ["7"]) == {"7": 1.0}
    assert shares({}, ["7", "8"]) == {UNATTRIBUTED: 1.0}
    assert shares({}, []) == {UNATTRIBUTED: 1.0}


def test_energy_follows_busy_share_and_idle_energy_goes_to_holders() -> None:
    assert energy_shares({"7": 0.25, UNATTRIBUTED: 0.75}, 5.0, ["7"]) == {"7": 0.25}
    assert energy_shares({}, 0.0, ["7", "8"]) == {"7": 0.5, "8": 0.5}
    assert energy_shares({}, 0.0, []) == {}


def _grid(start_s: float, values: list[float], period_s: float = 0.2) -> tuple[UtilSample, ...]:
    return tuple(UtilSample(int((start_s + (i + 1) * period_s) * 1e6), v)
                 for i, v in enumerate(values))


def test_each_sample_counts_for_the_period_since_the_one_before() -> None:
    samples = _grid(100.0, [100, 0, 50, 100, 0])
    window, busy = integrate_samples(samples, cursor_us=100_000_000)
    assert window == pytest.approx(1.0)
    assert busy == pytest.approx(0.2 * (1 + 0 + 0.5 + 1 + 0))


def test_first_look_only_starts_the_window() -> None:
    window, busy = integrate_samples(_grid(100.0, [100, 100, 100]), cursor_us=None)
    assert window == pytest.approx(0.4) and busy == pytest.approx(0.4)


def test_a_gap_in_the_samples_is_idle_and_the_sample_after_it_covers_one_period() -> None:
    # An idle GPU's driver takes no samples: 99.6 s without any, then a busy one.
    samples = _grid(100.0, [100, 100, 100]) + _grid(200.0, [50, 0])
    window, busy = integrate_samples(samples, cursor_us=100_000_000)
    assert window == pytest.approx(100.4)
    assert busy == pytest.approx(0.6 + 0.2 * 0.5)


def test_a_gap_from_a_cursor_nobody_read_on_from_is_left_out_as_lost() -> None:
    samples = _grid(200.0, [100, 100, 100])
    window, busy = integrate_samples(samples, cursor_us=100_000_000, continuous=False)
    assert window == pytest.approx(0.4) and busy == pytest.approx(0.4)


def test_a_gap_longer_than_any_driver_clock_could_run_is_a_jump_not_idle_time() -> None:
    samples = _grid(5000.0, [100, 100])
    window, busy = integrate_samples(samples, cursor_us=100_000_000, max_gap_us=50e6)
    assert window == pytest.approx(0.2) and busy == pytest.approx(0.2)


def test_time_before_a_jobs_start_is_not_its() -> None:
    samples = _grid(100.0, [100] * 5)
    window, busy = integrate_samples(samples, cursor_us=100_000_000, not_before_us=100_500_000)
    assert window == pytest.approx(0.5) and busy == pytest.approx(0.5)


def test_out_of_range_percentages_are_clamped() -> None:
    _, busy = integrate_samples(_grid(0.0, [150, -5]), cursor_us=0)
    assert busy == pytest.approx(0.2)


def test_a_mig_instance_has_its_compute_slices_share_of_the_gpu() -> None:
    from slurm_gpu_exporter.gpu.attribution.shares import mig_sm_fraction

    a100 = "NVIDIA A100-SXM4-80GB"
    assert mig_sm_fraction("NVIDIA A100-SXM4-80GB MIG 1g.10gb", a100) == 1 / 7
    assert mig_sm_fraction("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "NVIDIA H100") == 3 / 7
    assert mig_sm_fraction("NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb", a100) == 1 / 7
    assert mig_sm_fraction("NVIDIA A30 MIG 2g.12gb", "NVIDIA A30") == 2 / 4
    assert mig_sm_fraction("some MIG device", a100) is None
