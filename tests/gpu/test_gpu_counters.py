"""Job runs' GPU counters and their state-dir form (gpu/attribution/counters.py)."""

from __future__ import annotations

import pytest

from slurm_gpu_exporter.gpu.attribution.counters import CounterStore, JobGpuCounters


def test_a_counter_starts_at_zero_and_is_found_again_by_job_run() -> None:
    store = CounterStore()
    c = store.counter(("7", 100.0), "GPU-a", "0")
    c.accrue(window=1.0, busy=0.5, energy=2.0, memory=10, processes=1)
    assert store.counter(("7", 100.0), "GPU-a", "0") is c
    assert store.of_run(("7", 200.0)) is None  # a requeued run has counters of its own


def test_counters_saved_by_job_id_alone_go_to_the_first_run_of_that_id() -> None:
    store = CounterStore()
    store.import_state({"counters": {"7": {"GPU-a": ["0", 5.0, 4.0, 2.0, 3.0, 1, None]}}})
    store.forget_runs(set(), tracked={"7"})  # job 7 tracked, not yet seen running
    assert ("7", None) in store.runs
    per_run = store.of_run(("7", 100.0))
    assert per_run is not None and per_run["GPU-a"].busy == 2.0
    assert list(store.runs) == [("7", 100.0)]


def test_runs_no_longer_tracked_are_forgotten() -> None:
    store = CounterStore()
    store.counter(("7", 100.0), "GPU-a", "0")
    store.counter(("8", 100.0), "GPU-a", "0")
    store.forget_runs({("8", 100.0)}, tracked={"8"})
    assert list(store.runs) == [("8", 100.0)]


def test_state_round_trip_keeps_every_total() -> None:
    store = CounterStore()
    c = store.counter(("7", 100.0), "GPU-a", "0")
    c.hold(160.0, 100.0, 100.0, 55.0)
    c.accrue(window=55.0, busy=30.0, energy=900.0, memory=1 << 30, processes=2)
    assert store.add_unattributed_busy("GPU-a", "bob", 1.5) == 1.5
    assert store.add_unattributed_busy("GPU-a", "bob", 1.0) == pytest.approx(2.5)
    again = CounterStore()
    again.import_state(store.export_state())
    [restored] = again.of_run(("7", 100.0)).values()  # type: ignore[union-attr]
    assert restored == JobGpuCounters("0", 60.0, 55.0, 30.0, 900.0, 1 << 30, 160.0,
                                      fresh=False)
    assert again.unattributed_busy == {("GPU-a", "bob"): pytest.approx(2.5)}
    again.prune_gpus({"GPU-b"})
    assert again.unattributed_busy == {}


def test_unknown_time_is_held_but_not_allocated_and_allocated_never_shrinks() -> None:
    c = JobGpuCounters("0")
    c.hold(110.0, 100.0, 100.0, 10.0)
    assert (c.allocated, c.unknown) == (10.0, 0.0)
    c.hold(150.0, 100.0, 100.0, 20.0, unknown=20.0)  # 40 s held, 20 of them lost
    assert (c.allocated, c.unknown, c.held) == (30.0, 20.0, 50.0)
    # More unknown time than the poll held (a cursor from before a restart): only
    # what was held counts, so allocated does not go back.
    c.hold(155.0, 100.0, 100.0, 0.0, unknown=60.0)
    assert (c.allocated, c.unknown) == (30.0, 25.0)
    c.hold(156.0, 100.0, 100.0, 1.0, unknown=-3.0)
    assert (c.allocated, c.unknown) == (31.0, 25.0)
    # The driver's clock a little ahead: its window comes first, unknown takes the rest.
    c.hold(166.0, 100.0, 100.0, 4.2, unknown=6.0)
    assert c.unknown == pytest.approx(30.8) and c.allocated == pytest.approx(35.2)
