"""The simulated GPU backend (gpu/simulated.py), given its processes and a clock."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from slurm_gpu_exporter.gpu.simulated import SAMPLE_PERIOD_US, SimulatedBackend
from tests.support import Clock


@dataclass(frozen=True)
class Proc:
    gpu: int
    pid: int
    used_memory: int
    sm_percent: float


def busy_on_gpu_1(now: float) -> list[Proc]:
    return [Proc(1, 500, 2 << 30, 80.0)] if now >= 1000.0 else []


def test_samples_follow_the_processes_given_on_the_injected_clock() -> None:
    clock = Clock(1000.0)
    backend = SimulatedBackend(2, busy_on_gpu_1, gpu_memory=16 << 30, clock=clock)
    first = backend.read({})
    assert [r.index for r in first] == [0, 1]
    cursors = {r.uuid: (r.util_samples[-1].timestamp_us, 0) for r in first}
    clock.now += 2.0
    gpu0, gpu1 = backend.read(cursors)
    assert len(gpu1.util_samples) == pytest.approx(2e6 / SAMPLE_PERIOD_US, abs=1)
    assert {s.percent for s in gpu1.util_samples} == {80.0}
    assert {s.percent for s in gpu0.util_samples} == {0.0}
    assert [p.pid for p in gpu1.processes] == [500] and gpu0.processes == ()
    assert {s.pid for s in gpu1.process_samples} == {500}
    assert gpu1.memory_total == 16 << 30
    # Energy: a busy GPU draws more than an idle one over the same two seconds.
    assert gpu1.energy_mj - first[1].energy_mj > gpu0.energy_mj - first[0].energy_mj > 0


def test_gpm_figures_follow_the_busy_share_from_the_second_read_on() -> None:
    clock = Clock(1000.0)
    backend = SimulatedBackend(2, busy_on_gpu_1, clock=clock)
    first = backend.read({})
    assert all(r.gpm_supported and r.gpm is None for r in first)  # the first sample only
    clock.now += 2.0
    gpu0, gpu1 = backend.read({})
    assert gpu1.gpm is not None and gpu0.gpm is not None
    assert gpu1.gpm.seconds == pytest.approx(2.0)
    assert gpu1.gpm.activity["sm_active"] == pytest.approx(0.8 * 0.7)
    assert gpu0.gpm.activity["sm_active"] == 0.0
    assert gpu1.gpm.traffic["pcie_transmit"] > gpu0.gpm.traffic["pcie_transmit"] == 0.0
