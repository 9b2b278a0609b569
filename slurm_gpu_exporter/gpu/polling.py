"""The backend's life cycle: start-up and retries, reads in a worker thread, Xid events.

NVML is read in one long-lived worker thread per backend generation: a call that hangs
freezes the GPU figures (and shows as ``slurm_gpu_exporter_nvml_up 0``) but never the
job metrics or a scrape.
Xid events are read in a thread of their own.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from slurm_gpu_exporter.gpu.backend import GpuBackend, GpuUnavailable
from slurm_gpu_exporter.gpu.readings import BufferRead, DeviceReading
from slurm_gpu_exporter.gpu.xids import XidCounts
from slurm_gpu_exporter.node.source_health import SourceErrors

log = logging.getLogger(__name__)

Cursors = dict[str, tuple[int, int]]
T = TypeVar("T")

# An Xid event ends the wait at once; the timeout only says how often the Xid thread
# wakes for nothing, and each wake is a driver call and a thread switch (0.1-0.2 ms of
# CPU on a small VM): once per default sample, not every second (issue 49).
XID_WAIT_MS = 5000
# close() waits this long for the Xid thread; a thread still in the driver's wait then
# shuts NVML down itself when the wait returns (never under a call in flight).
XID_JOIN_S = 0.2


class XidWatch:
    """One backend generation's Xid thread: its stop flag, and whether it must shut the
    backend down when its wait returns (close() found it still waiting)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ended = False
        self.shutdown_at_end = False
        self.thread: threading.Thread | None = None


class ReadWorker:
    """One long-lived daemon thread that runs NVML reads one after another, each
    answered through a Future (its result, or the exception it raised).

    One per backend generation: a daemon, so that a call that never returns does not
    keep the agent from exiting (a thread pool's workers are joined at exit); starting
    a thread per read cost more than an idle GPU's read itself (issue 49).
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue())
        self._stopped = threading.Event()
        self._last: Future[Any] | None = None  # reads run in order: the last ends last
        self.thread = threading.Thread(target=self._serve, name="nvml-read", daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self._last = future
        self._queue.put((fn, future))
        return future

    @property
    def busy(self) -> bool:
        """True while a read runs or waits to run (NVML must not be shut down under it)."""
        last = self._last
        return last is not None and not last.done()

    def stop(self, wait: float = 1.0) -> None:
        """End the thread: at once when idle (joined for up to ``wait``); a read hung in
        NVML is left alone, and when it returns the thread ends without running more:
        what was queued behind it belongs to a backend that is gone."""
        self._stopped.set()
        self._queue.put(None)
        if not self.busy:
            self.thread.join(wait)

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None or self._stopped.is_set():
                if item is not None:
                    item[1].cancel()
                return
            fn, future = item
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)


class Poller:
    """Runs backend reads on the reader thread so that a hung call cannot stall sampling."""

    def __init__(self, backend: GpuBackend, worker: ReadWorker,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._backend = backend
        self._worker = worker
        self._clock = clock
        self._pending: Future[list[DeviceReading]] | None = None
        self._since = 0.0

    def _start(self, cursors: Cursors) -> Future[list[DeviceReading]]:
        return self._worker.submit(lambda: self._backend.read(cursors))

    def poll(self, cursors: Cursors, timeout: float) -> list[DeviceReading] | None:
        """The readings, or None while a read is still running (stuck).

        A read that was already stuck at the previous poll is not waited for again,
        so a hung NVML call costs the sampler one timeout, not one per sample.
        """
        if self._pending is None:
            self._pending = self._start(dict(cursors))
            self._since = self._clock()
            wait = timeout
        else:
            wait = 0.0
        try:
            result = self._pending.result(wait)
        except TimeoutError:
            return None
        finally:
            if self._pending.done():
                self._pending = None
        return result

    @property
    def busy(self) -> bool:
        """True while a read is in flight (NVML must not be shut down under it)."""
        return self._pending is not None

    @property
    def stuck_for(self) -> float:
        return self._clock() - self._since if self._pending is not None else 0.0


class BackendLink:
    """Owns the backend: initialises it (again after a failure), reads it without ever
    blocking the caller for longer than ``poll_timeout``, and watches Xid events.

    Errors are counted under "nvml" in the injected SourceErrors.
    """

    def __init__(self, backend: GpuBackend, errors: SourceErrors, *,
                 poll_timeout: float = 4.0, reinit_after: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.backend = backend
        self.errors = errors
        self.poll_timeout = poll_timeout
        self.reinit_after = reinit_after
        self.xids = XidCounts()
        self._clock = clock
        self._poller: Poller | None = None
        self._worker: ReadWorker | None = None  # this backend generation's reader thread
        self._initialised = False
        self._next_init = 0.0
        self._init_error_logged = False
        self._xid: XidWatch | None = None  # this generation's Xid thread
        self._xid_before: XidWatch | None = None  # the last one, while it may still wait
        self.driver: str | None = None  # the driver version of the last init
        self.generation = 0  # successful inits so far: a new one may be a reloaded driver

    def read(self, cursors: Cursors) -> list[DeviceReading] | None:
        """This poll's readings, or None (error counted) while the backend is down or stuck."""
        if not self._ensure_init():
            return None
        assert self._poller is not None
        try:
            readings = self._poller.poll(cursors, self.poll_timeout)
        except Exception as exc:  # the driver went away under us: start over later
            self.errors.count("nvml", f"reading the GPUs failed ({exc}); re-initialising in "
                              f"{self.reinit_after:.0f} s")
            self.close()
            self._next_init = self._clock() + self.reinit_after
            return None
        if readings is None:
            log.debug("NVML read stuck for %.0f s", self._poller.stuck_for)
            self.errors.count("nvml", "an NVML call has not returned (hung driver?); GPU "
                              "figures are frozen until it does")
        return readings

    def read_buffers(self, cursors: Cursors) -> list[BufferRead] | None:
        """A read of the sample buffers alone (between two polls), or None where the
        backend cannot (none, down, a read in flight) or the read failed: the next
        poll reads on from where the last good read got to, and counts its errors."""
        read = getattr(self.backend, "read_buffers", None)
        if (read is None or not self._initialised or self._poller is None
                or self._worker is None or self._poller.busy or self._worker.busy):
            return None
        future = self._worker.submit(lambda: read(cursors))
        try:
            return future.result(self.poll_timeout)
        except TimeoutError:
            return None
        except Exception as exc:
            log.debug("reading the sample buffers failed: %s", exc)
            return None

    def _ensure_init(self) -> bool:
        if self._initialised:
            return True
        now = self._clock()
        if now < self._next_init:
            return False
        before = self._xid_before
        if before is not None and before.thread is not None and before.thread.is_alive():
            return False  # its wait has yet to return and shut the last generation down
        self._xid_before = None
        self._next_init = now + self.reinit_after
        try:
            driver = self.backend.init()
        except GpuUnavailable as exc:
            if not self._init_error_logged:
                log.warning("%s. GPU metrics are off (slurm_gpu_exporter_nvml_up 0); job "
                            "metrics are still served. Retrying every %.0f s.", exc,
                            self.reinit_after)
                self._init_error_logged = True
            self.errors.count("nvml", str(exc), log_it=False)
            return False
        log.info("GPU backend ready (driver %s)", driver)
        self.driver = driver
        self.generation += 1
        self._initialised = True
        self._init_error_logged = False
        self._worker = ReadWorker()
        self._poller = Poller(self.backend, self._worker, self._clock)
        self._xid = XidWatch()
        self._xid.thread = threading.Thread(target=self._watch_xid, args=(self._xid,),
                                            name="xid-events", daemon=True)
        self._xid.thread.start()
        return True

    def close(self) -> None:
        """Stop the worker threads and release the backend.

        A read still hung inside NVML is left alone (its thread is a daemon): shutting
        NVML down under a call in flight is not safe on a real driver.
        """
        xid, self._xid = self._xid, None
        if xid is not None:
            xid.stop.set()
        in_flight = self._worker is not None and self._worker.busy
        if self._worker is not None:
            self._worker.stop()
        self._poller = self._worker = None
        if xid is not None and xid.thread is not None:
            xid.thread.join(XID_JOIN_S)
        if not self._initialised:
            return
        self._initialised = False
        if in_flight:
            log.warning("an NVML call is still hung; exiting without NVML shutdown")
            return
        if xid is not None:
            with xid.lock:
                if not xid.ended:  # still in the driver's wait: it shuts down when back
                    log.debug("the Xid wait is in the driver: NVML is shut down when it "
                              "returns (at most %d ms)", XID_WAIT_MS)
                    xid.shutdown_at_end = True
                    self._xid_before = xid
                    return
        self._shutdown()

    def _shutdown(self) -> None:
        try:
            self.backend.shutdown()
        except Exception as exc:  # already broken: nothing more to release
            log.debug("GPU backend shutdown: %s", exc)

    def _watch_xid(self, watch: XidWatch) -> None:
        try:
            self._wait_for_xids(watch.stop)
        finally:
            with watch.lock:
                watch.ended = True
                shutdown = watch.shutdown_at_end
            if shutdown:
                self._shutdown()

    def _wait_for_xids(self, stop: threading.Event) -> None:
        backoff = 1.0
        while not stop.is_set():
            try:
                events = self.backend.wait_xid(XID_WAIT_MS)
                backoff = 1.0
            except Exception as exc:  # a lost GPU makes the wait fail at once: back off
                log.debug("Xid event wait failed: %s", exc)
                stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            for event in events:
                self.xids.add(event.uuid, event.xid, event.at)
            for event in events:
                log.warning("Xid %d on GPU %s", event.xid, event.uuid)
