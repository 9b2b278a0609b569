"""Publish training progress from inside a Slurm job to the node's slurm-gpu-exporter.

Two ways in::

    from slurm_gpu_exporter import training
    training.relay()                     # instead of prometheus_client.start_http_server(port)

    training.step(1, samples=batch_size, loss=loss.item(), lr=lr)   # no instrumentation
    training.gauge("tokens_per_second", tps)

A daemon thread pushes the current values every ``interval`` seconds, as Prometheus
text exposition, to the agent's unix socket ``training.sock`` in the spool dir
(``$SLURM_GPU_EXPORTER_SPOOL_DIR``, else ``/run/slurm-gpu-exporter``). The agent
identifies the job by the sender's process, not by anything in the payload.

Nothing here blocks or raises into the training loop: each push carries the whole
current state, so a push the agent cannot take now (absent, slow, hung) is dropped and
the next one replaces it. At exit the thread sends one last push (bounded by
``EXIT_FLUSH_SECONDS``) and is joined.

This module imports the standard library and prometheus-client only.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from slurm_gpu_exporter.training_mlflow import RunWatch

__all__ = ["close", "gauge", "relay", "socket_path", "stats", "step"]

SPOOL_DIR_ENV = "SLURM_GPU_EXPORTER_SPOOL_DIR"
DEFAULT_SPOOL_DIR = "/run/slurm-gpu-exporter"
SOCKET_NAME = "training.sock"
PREFIX = "slurm_job_training_"
EXIT_FLUSH_SECONDS = 0.5
DEFAULT_INTERVAL = 15.0
# The agent refuses bigger messages; the client does not even try to send them.
MAX_MESSAGE_BYTES = 65536
MAX_MESSAGE_LINES = 2000

log = logging.getLogger(__name__)


def socket_path() -> str:
    """Where the agent listens: ``training.sock`` in the spool dir."""
    return os.path.join(os.environ.get(SPOOL_DIR_ENV) or DEFAULT_SPOOL_DIR, SOCKET_NAME)


@dataclass
class Stats:
    """What the client did; for tests and benchmarks, never needed by a training script."""

    sent: int = 0
    dropped: int = 0  # agent absent, busy, or the message too big
    errors: int = 0  # unexpected failures (rendering a registry, …)


class _Progress(Collector):
    """The values given to step() and gauge(); rendered as slurm_job_training_* families."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.steps = 0.0
        self.samples = 0.0
        self.loss: float | None = None
        self.lr: float | None = None
        self.last_step: float | None = None
        self.gauges: dict[str, float] = {}

    def step(self, n: float, samples: float | None, loss: float | None,
             lr: float | None) -> None:
        now = time.time()
        with self._lock:
            self.steps += n
            if samples is not None:
                self.samples += samples
            if loss is not None:
                self.loss = loss
            if lr is not None:
                self.lr = lr
            self.last_step = now

    def gauge(self, name: str, value: float) -> None:
        with self._lock:
            self.gauges[name] = value

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            steps, samples, loss, lr = self.steps, self.samples, self.loss, self.lr
            last_step, gauges = self.last_step, dict(self.gauges)
        yield CounterMetricFamily(PREFIX + "steps", "Training steps done.", value=steps)
        yield CounterMetricFamily(PREFIX + "samples", "Training samples processed.",
                                  value=samples)
        if loss is not None:
            yield GaugeMetricFamily(PREFIX + "loss", "Last training loss.", value=loss)
        if lr is not None:
            yield GaugeMetricFamily(PREFIX + "learning_rate", "Current learning rate.",
                                    value=lr)
        if last_step is not None:
            yield GaugeMetricFamily(PREFIX + "last_step_timestamp_seconds",
                                    "When the last step was reported (Unix time).",
                                    value=last_step)
        for name, value in gauges.items():
            full = name if name.startswith(PREFIX) else PREFIX + name
            yield GaugeMetricFamily(full, "Set by the training script.", value=value)


# prometheus-client's default process and platform collectors: the agent measures the
# job's processes itself, so these would only add series.
_RUNTIME_FAMILIES = ("process_", "python_gc_", "python_info")


class _WithoutRuntime:
    """A registry's families minus the default process and platform ones."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        for family in self._registry.collect():
            if not family.name.startswith(_RUNTIME_FAMILIES):
                yield family


class _Sender:
    """The one daemon thread that renders and pushes; the training thread never waits."""

    def __init__(self, path: str, interval: float) -> None:
        self.path = path
        self.interval = interval
        self.sources: list[CollectorRegistry] = []
        self.before_push: Callable[[], None] | None = None  # tagging MLflow runs
        self.stats = Stats()
        self._sock: socket.socket | None = None
        self._warned_size = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slurm-gpu-exporter-training",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, registry: CollectorRegistry) -> None:
        if not any(r is registry for r in self.sources):
            self.sources = [*self.sources, registry]  # replaced, not mutated: read unlocked
        self._wake.set()

    def stop(self, timeout: float) -> None:
        """Stop the thread after one last push; returns within about ``timeout`` s."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        # Connect at once: the agent proves which job we are in while we surely run,
        # not only at the first push or the flush at exit.
        with contextlib.suppress(Exception):
            self._connect()
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            try:
                if self.before_push is not None:
                    self.before_push()
                self.push_all()
            except Exception:  # never let the thread die: the next push may work
                self.stats.errors += 1
            if self._stop.is_set():
                break
        self._close()

    def push_all(self) -> None:
        for registry in self.sources:
            try:
                payload = generate_latest(_WithoutRuntime(registry))
            except Exception:
                self.stats.errors += 1
                continue
            self._send(payload)

    def _send(self, payload: bytes) -> None:
        if len(payload) > MAX_MESSAGE_BYTES or payload.count(b"\n") > MAX_MESSAGE_LINES:
            self.stats.dropped += 1
            if not self._warned_size:
                self._warned_size = True
                log.warning("training metrics not sent: %d bytes, %d lines is over the "
                            "agent's limit of %d bytes, %d lines; relay fewer series",
                            len(payload), payload.count(b"\n"), MAX_MESSAGE_BYTES,
                            MAX_MESSAGE_LINES)
            return
        sock = self._sock or self._connect()
        if sock is None:
            self.stats.dropped += 1
            return
        try:
            sock.send(payload, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
            self.stats.sent += 1
        except BlockingIOError:
            self.stats.dropped += 1  # agent busy or hung: this state is replaced next time
        except OSError:
            self.stats.dropped += 1  # agent gone or refused us: reconnect next time
            self._close()

    def _connect(self) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        sock.setblocking(False)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            return None
        self._sock = sock
        return sock

    def close_socket(self) -> None:
        """Close this process's copy of the connection (used in a forked child)."""
        self._close()

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


_lock = threading.Lock()
_sender: _Sender | None = None
_progress: _Progress | None = None
_progress_registry: CollectorRegistry | None = None
_mlflow_runs: RunWatch | None = None
_mlflow_registry: CollectorRegistry | None = None
_exiting = False  # after the exit hook, nothing starts a thread again


def _ensure_sender(interval: float | None, path: str | None) -> _Sender:
    global _sender
    if _exiting:
        raise RuntimeError("the interpreter is exiting")
    if _sender is None:
        _sender = _Sender(path or socket_path(),
                          DEFAULT_INTERVAL if interval is None else max(0.05, interval))
        _sender.start()
    elif interval is not None:
        _sender.interval = max(0.05, interval)
    return _sender


def relay(registry: CollectorRegistry = REGISTRY, interval: float = DEFAULT_INTERVAL,
          *, path: str | None = None) -> None:
    """Push ``registry``'s metrics to the node agent every ``interval`` seconds.

    Replaces ``prometheus_client.start_http_server(port)``. Returns at once and never
    raises; calling it again with another registry adds that registry. ``path``
    overrides the socket path (default: see :func:`socket_path`).
    """
    try:
        with _lock:
            _ensure_sender(interval, path).add(registry)
        _watch_mlflow()
    except Exception:
        pass


def _watch_mlflow() -> None:
    """Tie an active MLflow run to the job (training_mlflow.py); a dict look-up where
    the script does not use mlflow."""
    global _mlflow_runs, _mlflow_registry
    if "mlflow" not in sys.modules:
        return
    with _lock:
        if _mlflow_runs is None:
            from slurm_gpu_exporter.training_mlflow import RunWatch

            _mlflow_runs = RunWatch()
            _mlflow_registry = CollectorRegistry(auto_describe=False)
            _mlflow_registry.register(_mlflow_runs)
        runs, registry = _mlflow_runs, _mlflow_registry
    assert registry is not None
    new = runs.observe()
    sender = _sender
    # (Again) after close(): a new sender thread shows the runs seen before too.
    if new or (runs.seen and sender is not None and sender.before_push is None):
        with _lock:
            sender = _ensure_sender(None, None)
            sender.before_push = runs.tag_new_runs
            sender.add(registry)


def _ensure_progress() -> _Progress:
    global _progress, _progress_registry
    progress = _progress
    if progress is not None and _sender is not None:
        return progress
    with _lock:
        if _progress is None:
            _progress = _Progress()
            _progress_registry = CollectorRegistry(auto_describe=False)
            _progress_registry.register(_progress)
        # (Again) after close(): the counts go on from where they were.
        assert _progress_registry is not None
        _ensure_sender(None, None).add(_progress_registry)
        return _progress


def step(n: float = 1, *, samples: float | None = None, loss: float | None = None,
         lr: float | None = None) -> None:
    """Record ``n`` finished training steps (and the ``samples`` they processed).

    ``n`` and ``samples`` are increments since the last call; ``loss`` and ``lr`` are the
    current values. Costs a lock and a few additions; never raises.
    """
    try:
        _ensure_progress().step(float(n), _number(samples), _number(loss), _number(lr))
        _watch_mlflow()
    except Exception:
        pass


def gauge(name: str, value: float) -> None:
    """Set a gauge ``slurm_job_training_<name>`` (or ``name`` if already prefixed)."""
    try:
        _ensure_progress().gauge(str(name), float(value))
    except Exception:
        pass


def _number(value: float | None) -> float | None:
    # float() takes a 0-d tensor or a numpy scalar too.
    return None if value is None else float(value)


def stats() -> Stats:
    """Counts of messages sent and dropped so far."""
    return _sender.stats if _sender is not None else Stats()


def close(timeout: float = EXIT_FLUSH_SECONDS) -> None:
    """Send the last values and stop the thread (also done at exit).

    A later call to step() or relay() starts it again; step() counts go on.
    """
    global _sender
    with _lock:
        sender, _sender = _sender, None
    if sender is not None:
        sender.stop(timeout)


def _after_fork_in_child() -> None:
    # A forked child (a DataLoader worker) has no sender thread; it starts its own if
    # it publishes, never reusing the parent's connection.
    global _lock, _sender, _progress, _progress_registry, _mlflow_runs, _mlflow_registry
    if _sender is not None:
        _sender.close_socket()
    _lock = threading.Lock()
    _sender = None
    _progress = None
    _progress_registry = None
    _mlflow_runs = None
    _mlflow_registry = None


def _at_exit() -> None:
    global _exiting
    _exiting = True
    close()


atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)
