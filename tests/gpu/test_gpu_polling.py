"""The backend's life cycle (gpu/polling.py) over the in-process fake backend.

Time is a clock the test steps: retries are checked without sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from slurm_gpu_exporter.gpu.backend import GpuUnavailable
from slurm_gpu_exporter.gpu.polling import BackendLink
from slurm_gpu_exporter.gpu.readings import BufferRead, DeviceReading, XidEvent
from slurm_gpu_exporter.gpu.xids import XidCounts
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


class ThreadNotingBackend(FakeBackend):
    """The fake with a buffer read; notes the thread that runs each read, and holds the
    next read (that one only) until ``hold``, when given, is set."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[threading.Thread] = []
        self.hold: threading.Event | None = None

    def _enter(self) -> None:
        self.threads.append(threading.current_thread())
        hold, self.hold = self.hold, None
        if hold is not None:
            hold.wait()

    def read(self, cursors: dict[str, tuple[int, int]]) -> list[DeviceReading]:
        self._enter()
        return super().read(cursors)

    def read_buffers(self, cursors: dict[str, tuple[int, int]]) -> list[BufferRead]:
        self._enter()
        return [BufferRead(uuid) for uuid in cursors]


@pytest.fixture
def noting() -> ThreadNotingBackend:
    return ThreadNotingBackend()


@pytest.fixture
def noting_link(noting: ThreadNotingBackend, clock: Clock) -> Iterator[BackendLink]:
    # A read that is not hung answers within 0.5 s even on a loaded machine.
    link = BackendLink(noting, SourceErrors(), poll_timeout=0.5, reinit_after=60.0,
                       clock=clock)
    yield link
    if noting.hold is not None:
        noting.hold.set()
    link.close()


def reader_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "nvml-read"}


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


def test_polls_and_buffer_reads_all_run_on_one_long_lived_reader_thread(
    noting_link: BackendLink, noting: ThreadNotingBackend,
) -> None:
    before = reader_threads()  # other tests' readers, ending or hung on purpose
    cursors = {noting.uuid: (0, 0)}
    for _ in range(50):
        assert noting_link.read({}) is not None
        assert noting_link.read_buffers(cursors) == [BufferRead(noting.uuid)]
        assert len(reader_threads() - before) == 1
    (reader,) = set(noting.threads)  # a Thread object: an ident may be reused
    assert len(noting.threads) == 100
    assert reader.daemon and reader.is_alive() and reader.name == "nvml-read"


def test_a_read_released_after_hanging_is_followed_by_reads_on_the_same_thread(
    noting_link: BackendLink, noting: ThreadNotingBackend,
) -> None:
    cursors = {noting.uuid: (0, 0)}
    assert noting_link.read({}) is not None
    noting.hold = release = threading.Event()
    assert noting_link.read({}) is None
    assert noting_link.read_buffers(cursors) is None  # a read is in flight
    release.set()
    wait_until(lambda: noting_link.read({}) is not None, 5, poll=0.01)
    assert noting_link.read({}) is not None
    assert noting_link.read_buffers(cursors) == [BufferRead(noting.uuid)]
    assert len(set(noting.threads)) == 1 and len(noting.threads) == 4


def test_close_under_a_hung_read_returns_at_once_and_that_thread_serves_no_later_read(
    noting_link: BackendLink, noting: ThreadNotingBackend, clock: Clock,
) -> None:
    cursors = {noting.uuid: (0, 0)}
    assert noting_link.read({}) is not None
    old = noting.threads[-1]
    noting.hold = release = threading.Event()
    assert noting_link.read_buffers(cursors) is None  # hangs on the reader thread
    assert noting_link.read({}) is None  # queued behind it
    started = time.monotonic()
    noting_link.close()
    assert time.monotonic() - started < 0.8  # a join of the hung reader would take 1 s
    assert noting.shutdowns == 0 and old.is_alive()
    clock.now += 60.0
    assert noting_link.read({}) is not None  # a new generation, a fresh reader thread
    new = noting.threads[-1]
    assert new is not old and noting.inits == 2
    release.set()
    wait_until(lambda: not old.is_alive(), 5, "the old reader thread to end", poll=0.01)
    assert noting_link.read({}) is not None
    assert noting_link.read_buffers(cursors) == [BufferRead(noting.uuid)]
    # The old thread ran the hung read and nothing queued behind it (the old generation).
    assert noting.threads == [old, old, new, new, new]


def test_close_on_an_idle_reader_ends_its_thread(
    noting_link: BackendLink, noting: ThreadNotingBackend,
) -> None:
    assert noting_link.read({}) is not None
    reader = noting.threads[-1]
    noting_link.close()
    assert reader not in threading.enumerate() and noting.shutdowns == 1


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


class DriverLikeXidWait(FakeBackend):
    """An Xid wait as a real driver's: it returns on an event or at its timeout, not
    when NVML is shut down from another thread. Here it returns when ``release`` is set,
    and notes the timeouts it was asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.waiting = threading.Event()
        self.timeouts: list[int] = []

    def wait_xid(self, timeout_ms: int) -> list[XidEvent]:
        self.timeouts.append(timeout_ms)
        self.waiting.set()
        self.release.wait()
        return []


@pytest.fixture
def driver_like(clock: Clock) -> Iterator[tuple[BackendLink, DriverLikeXidWait]]:
    backend = DriverLikeXidWait()
    link = BackendLink(backend, SourceErrors(), poll_timeout=0.5, reinit_after=60.0,
                       clock=clock)
    yield link, backend
    backend.release.set()
    link.close()


def test_the_xid_thread_wakes_once_a_sample_not_every_second(
    driver_like: tuple[BackendLink, DriverLikeXidWait],
) -> None:
    # Each wake is a driver call and a thread switch; an event ends the wait at once.
    link, backend = driver_like
    assert link.read({}) is not None
    wait_until(backend.waiting.is_set, 5, "the Xid wait", poll=0.01)
    assert backend.timeouts and min(backend.timeouts) >= 5000


def test_close_during_the_xid_wait_returns_and_the_wait_shuts_nvml_down_when_it_ends(
    driver_like: tuple[BackendLink, DriverLikeXidWait],
) -> None:
    link, backend = driver_like
    assert link.read({}) is not None
    wait_until(backend.waiting.is_set, 5, "the Xid wait", poll=0.01)
    started = time.monotonic()
    link.close()
    assert time.monotonic() - started < 3.0  # not the wait's 5 s
    assert backend.shutdowns == 0  # never under the driver's wait
    backend.release.set()
    wait_until(lambda: backend.shutdowns == 1, 5, "the shutdown after the wait", poll=0.01)


def test_no_new_init_while_the_last_xid_wait_still_owes_its_shutdown(
    driver_like: tuple[BackendLink, DriverLikeXidWait], clock: Clock,
) -> None:
    link, backend = driver_like
    assert link.read({}) is not None
    wait_until(backend.waiting.is_set, 5, "the Xid wait", poll=0.01)
    link.close()
    clock.now += 60.0
    assert link.read({}) is None and backend.inits == 1  # that shutdown would end this one
    backend.release.set()
    wait_until(lambda: backend.shutdowns == 1, 5, "the shutdown after the wait", poll=0.01)
    assert link.read({}) is not None and backend.inits == 2
    time.sleep(0.05)
    assert backend.shutdowns == 1  # the new generation's NVML is left up
