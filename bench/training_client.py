"""What the training client costs a training loop, with the agent up, down and hung.

Each scenario runs in a fresh process: a loop of fixed work (about 25 µs a step), run
alone and then calling training.step() every step while relaying a registry of 100
series, pushing every 1 s (15 times the default rate, so the pushes' cost shows).
Figures: step() call time; the loop's slowdown against the same loop without the
client (median of PAIRS side-by-side pairs: on a busy machine this one is noisy); the
time one push takes on the client's thread and its share at the default interval;
close() at exit. On the agent's side: the time to take one typical and one largest
message, the CPU a job flooding at its line budget costs the agent, and families() for
64 jobs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import percentile, record

STEPS = 20_000
INTERVAL = 1.0
PAIRS = 5  # a run without and one with the client, side by side: the machine is shared


def _work() -> float:
    total = 0.0
    for i in range(400):
        total += i * 0.5
    return total


def _loop(training: object | None, calls: list[int]) -> float:
    started = time.perf_counter()
    for i in range(STEPS):
        _work()
        if training is not None:
            t0 = time.perf_counter_ns()
            training.step(1, samples=32, loss=1.0 / (i + 1), lr=0.001)  # type: ignore[attr-defined]
            calls.append(time.perf_counter_ns() - t0)
    return time.perf_counter() - started


def child() -> None:
    """Loops without and with the client, in pairs; prints the figures as JSON."""
    from prometheus_client import CollectorRegistry, Gauge

    from slurm_gpu_exporter import training

    registry = CollectorRegistry()
    layer = Gauge("grad_norm", "Gradient norm per layer.", ["layer"], registry=registry)
    for i in range(100):
        layer.labels(str(i)).set(i)
    calls: list[int] = []
    ratios, closes, base_loops = [], [], []
    for _ in range(PAIRS):
        base = _loop(None, calls)
        training.relay(registry, interval=INTERVAL)
        with_client = _loop(training, calls)
        sender = training._sender
        assert sender is not None
        t0 = time.perf_counter()
        sender.push_all()  # what the client's thread does each interval
        push_ms = (time.perf_counter() - t0) * 1000
        stats = training.stats()
        t0 = time.perf_counter()
        training.close()
        closes.append((time.perf_counter() - t0) * 1000)
        ratios.append(with_client / base)
        base_loops.append(base)
    print(json.dumps({
        "base_us_per_step": min(base_loops) / STEPS * 1e6,
        "slowdown_percent": (percentile(ratios, 50) - 1) * 100,
        "step_ns_p50": percentile(calls, 50), "step_ns_p99": percentile(calls, 99),
        "step_ns_max": max(calls), "push_ms": push_ms, "close_ms": max(closes),
        "sent": stats.sent, "dropped": stats.dropped}))


def _run_child(spool: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--child"], check=True,
                         capture_output=True, text=True,
                         env={**os.environ, "SLURM_GPU_EXPORTER_SPOOL_DIR": spool})
    return json.loads(out.stdout)


def _agent_side() -> dict[str, float]:
    from slurm_gpu_exporter.training_relay import JobIdentity, RelayLimits, TrainingStore

    job = JobIdentity("1", "bench")
    typical = (b"# TYPE slurm_job_training_steps_total counter\n"
               b"slurm_job_training_steps_total 1234\n"
               b"# TYPE slurm_job_training_samples_total counter\n"
               b"slurm_job_training_samples_total 39488\n"
               b"slurm_job_training_loss 0.25\nslurm_job_training_learning_rate 0.001\n"
               b"slurm_job_training_last_step_timestamp_seconds 1.7e9\n")
    limits = RelayLimits()
    big = bytearray()
    i = 0
    while i < limits.max_lines_per_message and len(big) < limits.max_message_bytes - 40:
        big += b'grad_norm{layer="%d"} 0.5\n' % i
        i += 1
    figures = {}
    for name, payload in (("typical", typical), ("largest", bytes(big))):
        store = TrainingStore(RelayLimits(max_series_per_job=100_000,
                                          max_bytes_per_job=1 << 30))
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            store.ingest(job, payload)
            times.append(time.perf_counter() - t0)
        figures[f"agent_ingest_{name}_ms_p50"] = round(percentile(times, 50) * 1000, 3)
    figures["agent_ingest_largest_series"] = i
    # What the sampler pays each cycle to collect 64 jobs' series.
    for per_job in (10, limits.max_series_per_job):
        store = TrainingStore()
        payload = b"".join(b'grad_norm{layer="%d"} 0.5\n' % k for k in range(per_job))
        for jobid in range(64):
            store.ingest(JobIdentity(str(jobid), "bench"), payload)
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            store.families()
            times.append(time.perf_counter() - t0)
        figures[f"agent_families_64_jobs_x_{per_job}_series_ms_p50"] = round(
            percentile(times, 50) * 1000, 2)
    per_line_ms = figures["agent_ingest_largest_ms_p50"] / i
    figures["agent_ingest_us_per_line"] = round(per_line_ms * 1000, 1)
    # A job flooding at its full line budget, all the time:
    figures["agent_cpu_percent_per_flooding_job"] = round(
        limits.lines_per_second * per_line_ms / 10, 1)
    return figures


def main() -> None:
    from slurm_gpu_exporter.training_relay import TrainingRelay

    figures: dict[str, object] = {"steps": STEPS, "push_interval_s": INTERVAL}
    with tempfile.TemporaryDirectory(prefix="sge-bench-") as spool:
        for scenario in ("up", "down", "hung"):
            relay = hung = None
            if scenario == "up":
                relay = TrainingRelay(spool, lambda pid: ("1", "bench"))
                relay.start()
            elif scenario == "hung":  # listens, never accepts nor reads
                hung = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                hung.bind(os.path.join(spool, "training.sock"))
                hung.listen(1)
            try:
                result = _run_child(spool)
            finally:
                if relay is not None:
                    relay.stop()
                if hung is not None:
                    hung.close()
                    os.unlink(os.path.join(spool, "training.sock"))
            figures[f"{scenario}_loop_us_per_step_without_client"] = round(
                result["base_us_per_step"], 1)
            figures[f"{scenario}_step_call_ns_p50"] = result["step_ns_p50"]
            figures[f"{scenario}_step_call_ns_p99"] = result["step_ns_p99"]
            figures[f"{scenario}_step_call_us_max"] = round(result["step_ns_max"] / 1000, 1)
            figures[f"{scenario}_loop_slowdown_percent_median"] = round(
                result["slowdown_percent"], 1)
            figures[f"{scenario}_push_ms"] = round(result["push_ms"], 3)
            # The client's thread at the default 15 s interval: one push per source.
            figures[f"{scenario}_push_cpu_percent_at_15s"] = round(
                result["push_ms"] / 15_000 * 100, 4)
            figures[f"{scenario}_close_ms_max"] = round(result["close_ms"], 2)
            figures[f"{scenario}_last_run_sent_dropped"] = \
                f"{result['sent']}/{result['dropped']}"
    figures.update(_agent_side())
    record("training_client", figures)


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        child()
    else:
        main()
