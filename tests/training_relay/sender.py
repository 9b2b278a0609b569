"""A process that publishes to the training socket, for the relay tests.

Run as ``python sender.py MODE [ARGS]``; it reads one line from stdin before it
starts, so the test can map its pid to a job before it connects. It prints one JSON
line on exit: what it did, and which threads were alive after the client's exit hook.

Modes:
  client VALUE SECONDS   relay() a registry with a forged jobid label, and step(), for
                         SECONDS (interval 0.05 s)
  restart                step(2), close(), step(3), close()
  too-big                relay() a registry of 3,000 series until 3 pushes dropped
  fork                   step() here and in a forked child (which ends at a
                         second line on stdin)
  raw KIND RATE SECONDS  send raw messages of KIND (small, big, series, badlabels,
                         garbage) at RATE per second for SECONDS, dropping what
                         would block
  mlflow RUN_ID SECONDS  step() for SECONDS with a stand-in mlflow module whose run
                         RUN_ID is active; reports the tags its client was given
"""

from __future__ import annotations

import atexit
import json
import socket
import sys
import threading
import time

report: dict[str, object] = {}


def _final_report() -> None:
    # Registered before the client is imported, so it runs after the client's exit hook.
    report["threads"] = sorted(t.name for t in threading.enumerate())
    print(json.dumps(report), flush=True)


atexit.register(_final_report)


def client(value: float, seconds: float) -> None:
    from prometheus_client import CollectorRegistry, Gauge

    from slurm_gpu_exporter import training

    registry = CollectorRegistry()
    forged = Gauge("demo_value", "A value.", ["jobid", "user"], registry=registry)
    forged.labels("forged", "mallory").set(value)
    training.relay(registry, interval=0.05)
    started = time.monotonic()
    slowest = 0.0
    steps = 0
    while time.monotonic() - started < seconds:
        t0 = time.perf_counter()
        training.step(1, samples=8, loss=value, lr=0.1)
        slowest = max(slowest, time.perf_counter() - t0)
        steps += 1
        time.sleep(0.001)
    stats = training.stats()
    report.update(steps=steps, slowest_step_s=slowest, sent=stats.sent,
                  dropped=stats.dropped, errors=stats.errors)


def fork() -> None:
    """Publish from this process and from a forked child, each on its own connection.

    The child exits after a second line on stdin, so the test sees it while it runs.
    """
    import os

    from slurm_gpu_exporter import training

    training.step(1)
    training.relay(interval=0.05)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(write_end)
        training.step(5)
        os.read(read_end, 1)
        training.close()
        os._exit(0)
    os.close(read_end)
    sys.stdin.readline()
    os.write(write_end, b"x")
    os.waitpid(child, 0)
    report.update(child=child)


def restart() -> None:
    """step(), close(), step() again: the counts go on."""
    from slurm_gpu_exporter import training

    training.step(2)
    training.close()
    training.step(3)
    training.close()
    report.update(sent=training.stats().sent)


def too_big() -> None:
    """relay() a registry over the agent's message limit."""
    from prometheus_client import CollectorRegistry, Gauge

    from slurm_gpu_exporter import training

    registry = CollectorRegistry()
    layer = Gauge("grad_norm", "Gradient norm per layer.", ["layer"], registry=registry)
    for i in range(3000):
        layer.labels(str(i)).set(i)
    training.relay(registry, interval=0.05)
    deadline = time.monotonic() + 10
    while training.stats().dropped < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    stats = training.stats()
    report.update(sent=stats.sent, dropped=stats.dropped)


def _payload(kind: str, i: int) -> bytes:
    if kind == "small":
        return f"flood_value {i}\n".encode()
    if kind == "big":
        return b"# " + b"x" * 100_000 + b"\nbig 1\n"
    if kind == "series":  # 1,000 new series per message
        return "".join(f'many{{i="{i}",j="{j}"}} 1\n' for j in range(1000)).encode()
    if kind == "badlabels":
        return b'wide{' + b",".join(b'l%d="v"' % k for k in range(20)) + b'} 1\n' + \
            b'long{l="' + b"v" * 500 + b'"} 1\nok_value 1\n'
    if kind == "garbage":
        return b"this is { not exposition\n"
    raise SystemExit(f"unknown payload kind {kind}")


def raw(path: str, kind: str, rate: float, seconds: float) -> None:
    """Send ``kind`` messages at ``rate`` per second for ``seconds``, never waiting."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(path)
    sock.setblocking(False)
    attempts = sent = 0
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        if attempts > elapsed * rate:
            time.sleep(0.001)
            continue
        attempts += 1
        try:
            sock.send(_payload(kind, attempts))
            sent += 1
        except BlockingIOError:
            pass  # the relay is not reading us: over our rate
        except OSError:
            break
    report.update(attempts=attempts, sent=sent,
                  per_second=attempts / (time.monotonic() - started))
    sock.close()


def with_mlflow_run(run_id: str, seconds: float) -> None:
    """A stand-in for mlflow (what the client reads of it) with one active run."""
    import types

    tagged: list[dict[str, str]] = []
    fake = types.ModuleType("mlflow")
    run = types.SimpleNamespace(info=types.SimpleNamespace(run_id=run_id, experiment_id="7"))
    fake.active_run = lambda: run  # type: ignore[attr-defined]
    fake.entities = types.SimpleNamespace(  # type: ignore[attr-defined]
        RunTag=lambda key, value: (key, value))

    class Client:
        def log_batch(self, run_id: str, tags: list[tuple[str, str]]) -> None:
            tagged.append({"run_id": run_id, **dict(tags)})

    fake.MlflowClient = Client  # type: ignore[attr-defined]
    sys.modules["mlflow"] = fake
    from slurm_gpu_exporter import training

    started = time.monotonic()
    while time.monotonic() - started < seconds:
        training.step(1)
        time.sleep(0.01)
    training.close(2.0)
    report.update(tagged=tagged)


def main() -> None:
    sys.stdin.readline()
    mode = sys.argv[1]
    if mode == "client":
        client(float(sys.argv[2]), float(sys.argv[3]))
    elif mode == "restart":
        restart()
    elif mode == "too-big":
        too_big()
    elif mode == "fork":
        fork()
    elif mode == "raw":
        from slurm_gpu_exporter.training import socket_path

        raw(socket_path(), sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
    elif mode == "mlflow":
        with_mlflow_run(sys.argv[2], float(sys.argv[3]))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
