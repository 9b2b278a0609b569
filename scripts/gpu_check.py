"""Real-GPU check: the agent with the real NVML against a GPU load of known duty cycle.

Run through ``scripts/gpu-check`` on any machine with an NVIDIA GPU and driver
(no Slurm needed). It:

1. writes a spool record for a made-up job holding one GPU,
2. starts the agent with the real NVML, over an empty cgroup root so that the
   job is found through ``SLURM_JOB_ID`` in the load's environment,
3. starts a load on that GPU (a spin kernel through the CUDA driver API, no
   toolkit or framework needed) busy for ``duty`` of every ``period`` seconds,
4. scrapes twice and prints what the agent attributed next to the truth,
5. where the GPU has NVML GPM (Hopper and later), runs a second load that is busy all
   the time on a known number of blocks, one per SM (``--blocks``), and shows busy
   near 100 % next to SM activity near blocks / SMs: what "busy" cannot tell.

Both loads print the GPM figures (SM activity, occupancy, tensor, DRAM) next to busy.
On a GPU whose architecture has GPM (Hopper and later) missing GPM figures fail the
check. ``--probe`` instead records the raw driver facts into a JSON file
(scripts/gpu_probe.py), and ``--shared`` checks two jobs sharing the GPU
(scripts/gpu_shared.py). The agent runs from this checkout (no installed entry point);
on any failure its log is printed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

JOBID = "990001"
NVML_DEVICE_ARCH_HOPPER = 9  # nvml.h: Hopper and later have GPM
# The agent from this checkout, without an installed entry point.
AGENT_MAIN = "import sys; from slurm_gpu_exporter.agent.cli import main; sys.exit(main())"

# A one-thread kernel that spins until the GPU's global timer passes start + ns.
SPIN_PTX = b"""
.version 6.0
.target sm_50
.address_size 64
.visible .entry spin(.param .u64 spin_ns)
{
    .reg .u64 %start, %now, %ns, %limit;
    .reg .pred %more;
    ld.param.u64 %ns, [spin_ns];
    mov.u64 %start, %globaltimer;
    add.u64 %limit, %start, %ns;
LOOP:
    mov.u64 %now, %globaltimer;
    setp.lt.u64 %more, %now, %limit;
    @%more bra LOOP;
    ret;
}
\0"""


def _cuda_check(result: int, what: str) -> None:
    if result != 0:
        raise RuntimeError(f"CUDA driver call {what} failed with error {result}")


CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
# GPM figures shown next to busy: (agent family suffix, column title).
GPM_COLUMNS = (("sm_active", "SM active"), ("sm_occupancy", "SM occupancy"),
               ("tensor_active", "tensor active"), ("dram_active", "DRAM active"))


def expected_sm_active(duty: float, blocks: int, sm_count: int) -> float:
    """SM activity a spin load should show: its busy share times the share of SMs its
    blocks hold (one block per SM while there are no more blocks than SMs)."""
    return duty * min(blocks, sm_count) / sm_count if sm_count > 0 else 0.0


def window_ratios(first: dict, second: dict, labels: dict[str, str]  # type: ignore[type-arg]
                  ) -> dict[str, float | None]:
    """Ratios over the window between two scrapes of the job's series: busy and each GPM
    activity over allocated seconds; None where a series is absent (no GPM)."""
    def delta(metric: str) -> float | None:
        a, b = _value(first, metric, **labels), _value(second, metric, **labels)
        return None if a is None or b is None else b - a

    allocated = delta("slurm_job_gpu_allocated_seconds_total")
    out: dict[str, float | None] = {"allocated": allocated}
    for key in ("busy", *(k for k, _ in GPM_COLUMNS)):
        part = delta(f"slurm_job_gpu_{key}_seconds_total")
        out[key] = part / allocated if part is not None and allocated else None
    return out


def busy_tolerance(duty: float, period: float, window: float, spacing: float) -> float:
    """How far a correct agent's busy ratio over ``window`` seconds may be from ``duty``:

    - the window's two edges cut the load's period: at most period * duty * (1 - duty) of
      busy time is in a partial period, over the window;
    - busy time is counted up to the newest driver sample, allocated time up to the
      poll: at each of the two scrapes they may differ by one sample ``spacing``;
    - the driver rounds each sample to a whole percent: half a point.
    """
    return (0.005 + period * duty * (1 - duty) / window
            + 2 * spacing * max(duty, 1 - duty) / window)


def gpm_required(architecture: int | None) -> bool:
    """Whether a GPU of this NVML architecture must give GPM figures (Hopper and later)."""
    return architecture is not None and architecture >= NVML_DEVICE_ARCH_HOPPER


def first_start(now: float, period: float, phase: float | None) -> float:
    """When a load's first burst starts, on the clock ``now`` is read from: at once
    without a phase; else at the next ``phase`` of a period (a fraction of it) counted
    from the epoch, so loads in different processes keep their bursts apart."""
    if phase is None:
        return now
    start = (now // period) * period + phase * period
    return start if start > now else start + period


def run_load(duty: float, period: float, seconds: float, memory_mib: int,
             blocks: int = 1, phase: float | None = None) -> None:
    """The GPU load: device 0 of CUDA_VISIBLE_DEVICES, busy ``duty`` of each period on
    ``blocks`` one-thread blocks, from ``phase`` of a period on the wall clock where one
    is given. Prints the GPU's SM count first (one JSON line)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise RuntimeError(f"no CUDA driver library here ({exc})") from None
    _cuda_check(cuda.cuInit(0), "cuInit")
    device = ctypes.c_int()
    _cuda_check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    sms = ctypes.c_int()
    _cuda_check(cuda.cuDeviceGetAttribute(ctypes.byref(sms),
                                          CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
                "cuDeviceGetAttribute")
    print(json.dumps({"sm_count": sms.value}), flush=True)
    context = ctypes.c_void_p()
    _cuda_check(cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device), "cuCtxCreate")
    module = ctypes.c_void_p()
    _cuda_check(cuda.cuModuleLoadData(ctypes.byref(module), SPIN_PTX), "cuModuleLoadData")
    function = ctypes.c_void_p()
    _cuda_check(cuda.cuModuleGetFunction(ctypes.byref(function), module, b"spin"),
                "cuModuleGetFunction")
    buffer = ctypes.c_uint64()
    _cuda_check(cuda.cuMemAlloc_v2(ctypes.byref(buffer), ctypes.c_size_t(memory_mib << 20)),
                "cuMemAlloc")
    spin_ns = ctypes.c_uint64(int(duty * period * 1e9))
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(spin_ns), ctypes.c_void_p))
    wall = time.time()
    next_start = time.monotonic() + first_start(wall, period, phase) - wall
    deadline = next_start + seconds
    time.sleep(max(0.0, next_start - time.monotonic()))
    while time.monotonic() < deadline:
        if duty > 0:
            _cuda_check(cuda.cuLaunchKernel(function, blocks, 1, 1, 1, 1, 1, 0, None, params,
                                            None), "cuLaunchKernel")
            _cuda_check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
        next_start += period
        time.sleep(max(0.0, next_start - time.monotonic()))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def _value(metrics: dict, name: str, **labels: str) -> float | None:  # type: ignore[type-arg]
    for have, value in metrics.get(name, []):
        if all(have.get(k) == v for k, v in labels.items()):
            return value
    return None


def _gpu_identity(index: int) -> tuple[str, int, str, int | None]:
    """(UUID, minor, name, NVML architecture or None) of one GPU."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        name = pynvml.nvmlDeviceGetName(handle)
        minor = pynvml.nvmlDeviceGetMinorNumber(handle)
        try:
            architecture: int | None = int(pynvml.nvmlDeviceGetArchitecture(handle))
        except pynvml.NVMLError:
            architecture = None
    finally:
        pynvml.nvmlShutdown()
    return (uuid.decode() if isinstance(uuid, bytes) else uuid, minor,
            name.decode() if isinstance(name, bytes) else name, architecture)


def _start_load(args: argparse.Namespace, uuid: str, duty: float, blocks: int,
                jobid: str = JOBID, phase: float | None = None
                ) -> tuple[subprocess.Popen[str], int]:
    """A load process on the GPU, as a process of a made-up job; (process, SM count)."""
    env = {**os.environ, "SLURM_JOB_ID": jobid, "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
           "CUDA_VISIBLE_DEVICES": uuid}
    load = subprocess.Popen(
        [sys.executable, __file__, "--load", "--duty", str(duty), "--period",
         str(args.period), "--seconds", str(args.seconds + 30), "--memory-mib",
         str(args.memory_mib), "--blocks", str(blocks),
         *(("--phase", str(phase)) if phase is not None else ())], env=env,
        stdout=subprocess.PIPE, text=True)
    assert load.stdout is not None
    line = load.stdout.readline()
    try:
        said = json.loads(line)
    except ValueError:
        said = None
    if not isinstance(said, dict) or not isinstance(said.get("sm_count"), int):
        load.kill()
        why = said.get("error", line) if isinstance(said, dict) else repr(line)
        raise RuntimeError(f"the GPU load did not start: {why}")
    return load, said["sm_count"]


def _wait(probe: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``probe`` until it is truthy; RuntimeError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)


def _ready(port: int, agent: subprocess.Popen[bytes]) -> bool:
    if agent.poll() is not None:
        raise RuntimeError(f"the agent exited with {agent.returncode} before it was ready")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _measure(args: argparse.Namespace, port: int, loads: list[subprocess.Popen[str]],
             jobs: list[dict[str, str]]) -> tuple[dict, dict, float]:  # type: ignore[type-arg]
    """Two scrapes ``args.seconds`` apart, once every job's busy time (``jobs``: their
    labels) has started to grow (their first windows are behind them); raises if a
    load died."""
    def alive() -> None:
        for load in loads:
            if load.poll() is not None:
                raise RuntimeError(f"the GPU load exited early ({load.returncode})")

    def counting() -> bool:
        alive()
        metrics = _scrape(port)
        return all((_value(metrics, "slurm_job_gpu_busy_seconds_total", **labels) or 0) > 0
                   for labels in jobs)
    _wait(counting, 60, "the jobs' busy time to grow")
    first = _scrape(port)
    t0 = time.time()
    time.sleep(args.seconds)
    second = _scrape(port)
    alive()
    return first, second, time.time() - t0


def _stop(*procs: subprocess.Popen) -> None:  # type: ignore[type-arg]
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _fmt(value: float | None) -> str:
    return "absent" if value is None else f"{value:.4f}"


def load_rows(title: str, ratios: dict[str, float | None], busy_truth: float,
              sm_expected: float) -> list[tuple[str, object]]:
    """The table rows of one load: busy and GPM figures next to what they should be."""
    rows: list[tuple[str, object]] = [
        (f"{title}: busy ratio (agent)", _fmt(ratios["busy"])),
        (f"{title}: busy ratio (truth)", f"{busy_truth:.4f}"),
    ]
    for key, name in GPM_COLUMNS:
        rows.append((f"{title}: {name} ratio (agent)", _fmt(ratios[key])))
        if key == "sm_active":
            rows.append((f"{title}: SM active ratio (expected)", f"{sm_expected:.4f}"))
    return rows


def hold(work: Path, jobid: str, minor: int) -> None:
    """A spool record under ``work`` for a made-up job holding the GPU ``minor``."""
    from slurm_gpu_exporter.hooks import spool

    (work / "cgroup").mkdir(exist_ok=True)
    fd = spool.open_spool_dir(str(work / "spool"), create=True)
    try:
        spool.write_record(fd, spool.JobRecord(
            jobid=jobid, uid=os.getuid(), user="gpucheck", job_gpus=str(minor),
            cuda_visible_devices=str(minor), start_time=time.time()))
    finally:
        os.close(fd)


def start_agent(work: Path, port: int, interval: float) -> subprocess.Popen[bytes]:
    """The agent from this checkout over the spool under ``work``, logging to agent.log
    there; an empty cgroup root, so jobs are found through their SLURM_JOB_ID."""
    return subprocess.Popen(
        [sys.executable, "-c", AGENT_MAIN,
         "--web.listen-address", f"127.0.0.1:{port}", "--spool-dir", str(work / "spool"),
         "--state-dir", str(work / "state"), "--cgroup-root", str(work / "cgroup"),
         "--sample-interval", str(interval), "--slurm-lookup", "off"],
        stdout=(work / "agent.log").open("wb"), stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(REPO)})


def print_table(rows: list[tuple[str, object]], as_json: bool) -> None:
    """The check's table, a row a line (and once more as JSON where asked)."""
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value if value is not None else 'absent'}")
    if as_json:
        print(json.dumps(dict(rows), default=str))


def check(args: argparse.Namespace) -> int:
    try:
        uuid, minor, name, architecture = _gpu_identity(args.gpu)
    except Exception as exc:
        print(f"gpu-check: no usable NVIDIA GPU {args.gpu} here ({exc}); check the driver "
              "with nvidia-smi", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="sge-gpu-check-"))
    hold(work, JOBID, minor)
    port = free_port()
    agent = start_agent(work, port, args.interval)
    labels = {"jobid": JOBID, "gpu": str(args.gpu)}
    load = None
    ok = False
    try:
        _wait(lambda: _ready(port, agent), 30, "the agent to be ready")
        load, sm_count = _start_load(args, uuid, args.duty, 1)
        first, second, elapsed = _measure(args, port, [load], [labels])
        _stop(load)
        spin = window_ratios(first, second, labels)
        energy = _delta(first, second, "slurm_job_gpu_energy_joules_total", labels)
        rows: list[tuple[str, object]] = [
            ("GPU", f"{args.gpu} {name} {uuid} (minor {minor}, {sm_count} SMs)"),
            ("window", f"{elapsed:.1f} s per load; spin load {args.duty:.0%} of "
                       f"{args.period:g} s on 1 block"),
            ("attributed processes", _value(second, "slurm_job_gpu_processes", **labels)),
            ("attributed memory MiB", _mib(_value(second, "slurm_job_gpu_memory_used_bytes",
                                                  **labels))),
            ("allocated seconds", spin["allocated"]),
            *load_rows("spin", spin, args.duty, expected_sm_active(args.duty, 1, sm_count)),
            ("spin: busy error, percentage points",
             f"{100 * (spin['busy'] - args.duty):+.2f}" if spin["busy"] is not None else None),
            ("energy J (job)", energy),
            ("mean power W (job)", f"{energy / elapsed:.1f}" if energy else None),
        ]
        tolerance = busy_tolerance(args.duty, args.period, elapsed, args.spacing)
        rows.append(("spin: busy tolerance, percentage points", f"±{100 * tolerance:.2f}"))
        ok = spin["busy"] is not None and abs(spin["busy"] - args.duty) <= tolerance
        if spin["sm_active"] is None and gpm_required(architecture):
            rows.append(("GPM", f"FAILED: no GPM figures on a GPU of NVML architecture "
                                f"{architecture} (Hopper or later has GPM)"))
            ok = False
        elif spin["sm_active"] is None:
            rows.append(("blocks load", "not run: no GPM figures (a GPU before Hopper)"))
        else:
            blocks = args.blocks or max(1, sm_count // 4)
            load, _ = _start_load(args, uuid, 1.0, blocks)
            first, second, _ = _measure(args, port, [load], [labels])
            full = window_ratios(first, second, labels)
            expected = expected_sm_active(1.0, blocks, sm_count)
            rows += load_rows(f"{blocks} blocks/{sm_count} SMs", full, 1.0, expected)
            ok = (ok and full["busy"] is not None and full["busy"] >= 0.98
                  and full["sm_active"] is not None and abs(full["sm_active"] - expected) <= 0.05)
        rows += [
            ("nvml sample duration s", _value(second, "slurm_gpu_exporter_sample_duration_seconds",
                                              source="nvml")),
            ("total sample duration s", _value(second,
                                               "slurm_gpu_exporter_sample_duration_seconds",
                                               source="total")),
            ("nvml_up", _value(second, "slurm_gpu_exporter_nvml_up")),
        ]
        print_table(rows, args.json)
        return 0 if ok else 1
    except RuntimeError as exc:
        print(f"gpu-check: {exc}; the agent's log follows", file=sys.stderr)
        return 1
    finally:
        _stop(*(p for p in (load, agent) if p is not None))
        if not ok:
            sys.stderr.write((work / "agent.log").read_text(errors="replace")[-20000:])
        print(f"(agent log: {work / 'agent.log'})")


def _delta(first: dict, second: dict, metric: str,  # type: ignore[type-arg]
           labels: dict[str, str]) -> float | None:
    a, b = _value(first, metric, **labels), _value(second, metric, **labels)
    return None if a is None or b is None else b - a


def _mib(value: float | None) -> str | None:
    return None if value is None else f"{value / 2**20:.0f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU to load")
    p.add_argument("--duty", type=float, default=0.3, help="busy fraction of each period")
    p.add_argument("--period", type=float, default=2.0, help="seconds")
    p.add_argument("--seconds", type=float, default=60.0, help="measured window")
    p.add_argument("--interval", type=float, default=1.0, help="agent --sample-interval")
    p.add_argument("--memory-mib", type=int, default=1024, help="GPU memory the load holds")
    p.add_argument("--blocks", type=int, default=0,
                   help="blocks of the second (always busy) load, one per SM; 0: a quarter "
                        "of the GPU's SMs")
    p.add_argument("--spacing", type=float, default=1 / 6,
                   help="driver sample spacing, s, for the busy tolerance (a probe measures it)")
    p.add_argument("--json", action="store_true", help="also print the table as JSON")
    p.add_argument("--probe", action="store_true",
                   help="record the raw driver facts (sample clocks, spacing, buffer span, idle "
                        "samples, process samples per read, energy steps, GPM return codes) "
                        "into --out instead of checking")
    p.add_argument("--out", type=Path, default=Path("gpu-probe.json"),
                   help="where --probe writes its JSON (gpu-probe.json)")
    p.add_argument("--probe-seconds", type=float, default=10.0,
                   help="seconds --probe polls each call, before and again during the load")
    p.add_argument("--probe-busy", type=float, default=40.0,
                   help="seconds of 100 %% load before --probe reads the whole sample buffer")
    p.add_argument("--wheels", metavar="DIR",
                   help="(scripts/gpu-check) make .venv from the wheels in DIR, offline; see "
                        "docs/gpu-check.md")
    p.add_argument("--shared", action="store_true",
                   help="two made-up jobs share the GPU: each one's load busy --duty of every "
                        "period, half a period apart (--duty 0.5 at most); each job must get "
                        "its own load's busy time")
    p.add_argument("--load", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--phase", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.load:
        try:
            run_load(args.duty, args.period, args.seconds, args.memory_mib, max(1, args.blocks),
                     args.phase)
        except RuntimeError as exc:  # to the parent, which says it in one line
            print(json.dumps({"error": str(exc)}), flush=True)
            return 1
        return 0
    if args.probe:
        return probe(args)
    if args.shared:
        import gpu_shared

        return gpu_shared.check_shared(args)
    return check(args)


def probe(args: argparse.Namespace) -> int:
    """--probe: the driver facts into args.out, with the spin load running where CUDA is."""
    import gpu_probe

    def start_load(uuid: str) -> tuple[subprocess.Popen[str], str]:
        load, sm_count = _start_load(args, uuid, args.duty, 1)
        return load, f"spin load {args.duty:.0%} of {args.period:g} s on 1 of {sm_count} SMs"

    def start_full_load(uuid: str) -> tuple[subprocess.Popen[str], str]:
        load, sm_count = _start_load(args, uuid, 1.0, 1)
        return load, f"spin load 100 % on 1 of {sm_count} SMs"

    try:
        report = gpu_probe.run_probe(args.out, [args.gpu], args.probe_seconds, 0.5,
                                     start_load, start_full_load, args.probe_busy)
    except Exception as exc:  # pynvml's errors and any other: say what and where
        print(f"gpu-check: the probe failed ({type(exc).__name__}: {exc}); is the NVIDIA "
              "driver loaded (nvidia-smi)?", file=sys.stderr)
        return 2
    for gpu in report["gpus"]:
        device, full = gpu["before_load"]["device_samples"], gpu["full_buffer"]
        print(f"GPU {gpu['index']} {gpu['name']}: device samples on {device['clock']}, "
              f"process samples on {gpu['before_load']['process_samples']['clock']}; "
              f"load: {gpu.get('load')}; whole buffer "
              f"({'under 100 % load' if full['under_load'] else 'as found'}): "
              f"{full['samples']} samples over {full.get('span_s', 0.0):.1f} s")
    print(f"probe written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
