"""The backend's life cycle (gpu/polling.py) over the in-process fake backend.

Time is a clock the test steps: retries are checked without sleeping.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from slurm_gpu_exporter.gpu.backend import GpuUnavailable, XidEvent
from slurm_gpu_exporter.gpu.polling import BackendLink, XidCounts
from slurm_gpu_exporter.node.source_health import SourceErrors
from tests.gpu.fake_gpu import FakeBackend
from tests.support import Clock, wait_until


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def link(backend: FakeBackend, clock: Clock) -> Iterator[BackendLink]:
    link = BackendLink(backend, SourceErrors(), poll_timeout=0.05, reinit_after=60.0,
                       clock=clock)
    yield link
    backend.hang.clear()
    link.close()


def nvml_errors(link: BackendLink) -> int:
    return link.errors.snapshot()["nvml"]


def test_a_failed_init_is_retried_after_reinit_after_on_the_injected_clock(
    link: BackendLink, backend: FakeBackend, clock: Clock,
) -> None:
    backend.init_error = GpuUnavailable("no driver")
    assert link.read({}) is None
    assert backend.inits == 1 and nvml_errors(link) == 1
    clock.now += 59.0
    assert link.read({}) is None
    assert backend.inits == 1  # not yet: no retry before reinit_after
    backend.init_error = None
    clock.now += 1.0
    readings = link.read({})
    assert backend.inits == 2
    assert readings is not None and readings[0].uuid == backend.uuid


def test_a_read_that_fails_shuts_the_backend_down_until_reinit_after(
    link: BackendLink, backend: FakeBackend, clock: Clock,
) -> None:
    assert link.read({}) is not None
    backend.read_error = RuntimeError("GPU is lost")
    assert link.read({}) is None
    assert backend.shutdowns == 1 and nvml_errors(link) == 1
    backend.read_error = None
    clock.now += 30.0
    assert link.read({}) is None and backend.inits == 1
    clock.now += 30.0
    assert link.read({}) is not None and backend.inits == 2


def test_a_hung_read_is_waited_for_once_then_reports_none_at_once(
    link: BackendLink, backend: FakeBackend, clock: Clock,
) -> None:
    assert link.read({}) is not None
    backend.hang.set()
    assert link.read({}) is None
    assert link._poller is not None and link._poller.busy
    clock.now += 7.0
    assert link._poller.stuck_for == 7.0  # measured on the injected clock
    assert link.read({}) is None
    assert nvml_errors(link) == 2
    backend.hang.clear()
    # The hung read returns; its readings are the next poll's.
    wait_until(lambda: link.read({}) is not None, 5, poll=0.01)


def test_close_leaves_a_hung_backend_without_shutdown(
    link: BackendLink, backend: FakeBackend,
) -> None:
    assert link.read({}) is not None
    backend.hang.set()
    assert link.read({}) is None
    link.close()
    assert backend.shutdowns == 0  # never shut NVML down under a call in flight


def test_xid_events_are_counted_per_gpu_by_the_xid_thread(
    link: BackendLink, backend: FakeBackend,
) -> None:
    assert link.read({}) is not None  # starts the Xid thread
    backend.xids = [XidEvent(backend.uuid, 79), XidEvent(backend.uuid, 79),
                    XidEvent("GPU-other", 13)]
    wait_until(lambda: link.xids.of(backend.uuid) == ((79, 2),), 5, poll=0.01)
    assert link.xids.of("GPU-other") == ((13, 1),)


def test_xid_counts_of_gpus_no_longer_present_are_dropped() -> None:
    xids = XidCounts()
    xids.add("GPU-a", 48)
    xids.add("GPU-b", 31)
    xids.prune({"GPU-b"})
    assert xids.of("GPU-a") == () and xids.of("GPU-b") == ((31, 1),)
