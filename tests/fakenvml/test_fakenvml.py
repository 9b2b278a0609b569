"""Self-tests of the fake NVML library, driven through the real nvidia-ml-py.

Each test starts a short Python process with ``FakeNvml.env()`` (the library
is picked with LD_LIBRARY_PATH, which only a new process honours), lets it call
pynvml and print JSON, and checks what it saw.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fakenvml import (
    IDEAL_DRIVER,
    Device,
    FakeNvml,
    MigInstance,
    NvmlState,
    Pattern,
    Process,
    XidEvent,
)

pytestmark = pytest.mark.fakenvml

GIB = 1024**3
NO_ID = 0xFFFFFFFF

PRELUDE = '''
import json, sys, threading, time
import pynvml as N

ERRNAMES = {getattr(N, k): k[len("NVML_ERROR_"):] for k in dir(N) if k.startswith("NVML_ERROR_")}

def call(fn, *args, **kw):
    """fn's result, or "ERR:<name>" for an NVML error."""
    try:
        return fn(*args, **kw)
    except N.NVMLError as e:
        return "ERR:" + ERRNAMES.get(e.value, str(e.value))

def out(obj):
    print(json.dumps(obj), flush=True)

def sync():
    """Tell the test we are ready, wait for its go-ahead."""
    out("ready")
    sys.stdin.readline()

def procs(rows):
    return rows if isinstance(rows, str) else sorted(
        [p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId] for p in rows)
'''


def _script(body: str) -> list[str]:
    return [sys.executable, "-c", PRELUDE + textwrap.dedent(body)]


def run(fake: FakeNvml, body: str, timeout: float = 20) -> Any:
    """Run ``body`` (after PRELUDE) against the fake; return its last JSON line."""
    proc = subprocess.run(
        _script(body), env=fake.env(), capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


class Interactive:
    """A pynvml process the test steps through with sync()/go()."""

    def __init__(self, fake: FakeNvml, body: str) -> None:
        self.proc = subprocess.Popen(
            _script(body),
            env=fake.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait_ready(self) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert json.loads(line) == "ready", line

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 20) -> tuple[Any, str]:
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1]), err


# ----------------------------------------------------------- pure Python


def test_pattern_integral_is_exact() -> None:
    p = Pattern.square(3, 30, origin=1000.0)
    assert p.integral(1000, 1030) == pytest.approx(300)
    assert p.integral(1000 - 300, 1000 + 300) == pytest.approx(20 * 300)
    assert p.mean(1001, 1002) == 100
    assert p.mean(1004, 1005) == 0
    assert p.integral(1002.5, 1033.5) == pytest.approx(50 + 300)
    once = Pattern([(2, 50), (1, 100)], origin=10, repeat=False)
    assert once.integral(0, 100) == pytest.approx(200)
    assert once.value_at(9.9) == 0 and once.value_at(12.5) == 100 and once.value_at(13) == 0
    with pytest.raises(ValueError):
        Pattern([(0, 50)])
    with pytest.raises(ValueError):
        Pattern([(1, 101)])


def test_render_rejects_bad_values(tmp_path: Path) -> None:
    fake = FakeNvml(tmp_path)
    with pytest.raises(ValueError):
        fake.render(NvmlState(devices=[Device(0), Device(0)]))
    with pytest.raises(ValueError):
        fake.render(NvmlState(devices=[Device(0, name="two\nlines")]))
    with pytest.raises(ValueError):
        fake.render(NvmlState(devices=[Device(0, errors={"nvmlDeviceGetName": "NOPE"})]))
    with pytest.raises(ValueError):
        fake.render(NvmlState(devices=[Device(0, processes=[Process(1), Process(1)])]))


def test_an_energy_reset_restarts_the_counter_lower_once_then_it_continues(
    tmp_path: Path,
) -> None:
    fake = FakeNvml(tmp_path)

    def energy(dev: Device, now: float) -> str:
        text = fake.render(NvmlState(devices=[dev]), now)
        [line] = [ln for ln in text.splitlines() if ln.startswith("energy ")]
        return line

    dev = Device(0, power_w=200.0, energy_base_mj=5 * 10**9)
    assert energy(dev, 100.0) == "energy 5000000000.0 100.0"
    assert energy(dev, 150.0) == "energy 5000000000.0 100.0"  # today: it continues
    dev.energy_base_mj, dev.energy_reset_at = 10**9, 160.0  # a driver reload at 160
    assert energy(dev, 170.0) == "energy 1000000000.0 160.0"  # reads 1e9 + 200 W x 10 s
    assert energy(dev, 180.0) == "energy 1000000000.0 160.0"  # not restarted again
    dev.power_w = 100.0
    assert energy(dev, 190.0) == "energy 1006000000.0 190.0"  # continued from the reset
    with pytest.raises(ValueError):
        energy(Device(1, energy_reset_at=float("inf")), 200.0)


# --------------------------------------------------------- through pynvml


def test_devices_and_identity(fake: FakeNvml) -> None:
    fake.write(
        NvmlState(
            driver_version="535.104.05",
            cuda_driver_version=12020,
            devices=[
                Device(0, uuid="GPU-aaaa", minor=3, name="NVIDIA H100 80GB HBM3",
                       pci_bus_id="00000000:1B:00.0", serial="1321"),
                Device(1, uuid="GPU-bbbb", minor=1),
            ],
        )
    )  # fmt: skip
    got = run(
        fake,
        """
        N.nvmlInit()
        devs = []
        for i in range(N.nvmlDeviceGetCount()):
            h = N.nvmlDeviceGetHandleByIndex(i)
            pci = N.nvmlDeviceGetPciInfo(h)
            devs.append([N.nvmlDeviceGetIndex(h), N.nvmlDeviceGetUUID(h), N.nvmlDeviceGetName(h),
                         N.nvmlDeviceGetMinorNumber(h), pci.busId, pci.bus,
                         N.nvmlDeviceGetSerial(h)])
        byuuid = N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByUUID("GPU-bbbb"))
        out({"driver": N.nvmlSystemGetDriverVersion(), "nvml": N.nvmlSystemGetNVMLVersion(),
             "cuda": N.nvmlSystemGetCudaDriverVersion(),
             "cuda2": N.nvmlSystemGetCudaDriverVersion_v2(), "devs": devs, "byuuid": byuuid,
             "badindex": call(N.nvmlDeviceGetHandleByIndex, 2),
             "baduuid": call(N.nvmlDeviceGetHandleByUUID, "GPU-cccc"),
             "shutdown": [call(N.nvmlShutdown), call(N.nvmlDeviceGetCount)]})
        """,
    )
    assert got["driver"] == "535.104.05"
    assert got["nvml"] == "12.535.104.05"
    assert got["cuda"] == got["cuda2"] == 12020
    assert got["devs"] == [
        [0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", 3, "00000000:1B:00.0", 0x1B, "1321"],
        [1, "GPU-bbbb", "NVIDIA A100-SXM4-80GB", 1, "00000000:11:00.0", 0x11, "1650000000001"],
    ]
    assert got["byuuid"] == 1
    assert got["badindex"] == "ERR:INVALID_ARGUMENT"
    assert got["baduuid"] == "ERR:NOT_FOUND"
    assert got["shutdown"] == [None, "ERR:UNINITIALIZED"]


def test_memory_v1_and_v2(fake: FakeNvml) -> None:
    fake.write(
        NvmlState(
            devices=[
                Device(0, memory_total=80 * GIB, memory_reserved=GIB,
                       processes=[Process(10, 2 * GIB), Process(11, GIB, kind="graphics")]),
                Device(1, memory_total=40 * GIB, memory_used=5 * GIB),
            ]
        )
    )  # fmt: skip
    got = run(
        fake,
        """
        N.nvmlInit()
        res = []
        for i in range(2):
            h = N.nvmlDeviceGetHandleByIndex(i)
            m1 = N.nvmlDeviceGetMemoryInfo(h)
            m2 = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
            res.append([[m1.total, m1.used, m1.free],
                        [m2.version, m2.total, m2.reserved, m2.used, m2.free]])
        out(res)
        """,
    )
    v2 = 0x02000028
    assert got[0] == [[80 * GIB, 4 * GIB, 76 * GIB], [v2, 80 * GIB, GIB, 3 * GIB, 76 * GIB]]
    assert got[1] == [[40 * GIB, 5 * GIB, 35 * GIB], [v2, 40 * GIB, 0, 5 * GIB, 35 * GIB]]


def test_power_energy_temperature_ecc(fake: FakeNvml) -> None:
    fake.write(
        NvmlState(devices=[Device(0, power_w=250.5, energy_base_mj=10**9, temperature_c=61,
                                  ecc_corrected=7, ecc_uncorrected=2)])
    )  # fmt: skip
    got = run(
        fake,
        """
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        t0 = time.time(); e0 = N.nvmlDeviceGetTotalEnergyConsumption(h)
        time.sleep(0.4)
        t1 = time.time(); e1 = N.nvmlDeviceGetTotalEnergyConsumption(h)
        out({"power": N.nvmlDeviceGetPowerUsage(h), "e0": e0, "de": e1 - e0, "dt": t1 - t0,
             "temp": N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU),
             "tempv": N.nvmlDeviceGetTemperatureV(h, N.NVML_TEMPERATURE_GPU),
             "ecc": [N.nvmlDeviceGetTotalEccErrors(h, e, c) for e in (0, 1) for c in (0, 1)]})
        """,
    )
    assert got["power"] == 250500
    assert got["e0"] >= 10**9
    # The counter moves in steps (energy_step_ms, like real drivers): each of the two
    # readings can lag the truth by up to one step, so their difference is within one
    # step's energy of power x time (plus the time between a reading and its clock).
    step_s = NvmlState().energy_step_ms / 1000
    assert abs(got["de"] - 250.5 * 1000 * got["dt"]) <= 250.5 * 1000 * (step_s + 0.02)
    assert got["temp"] == got["tempv"] == 61
    assert got["ecc"] == [7, 7, 2, 2]


def test_processes_by_kind(fake: FakeNvml) -> None:
    fake.write(
        NvmlState(
            devices=[
                Device(0, processes=[
                    Process(100, GIB), Process(101, 2 * GIB, kind="graphics"),
                    Process(102, 3 * GIB, kind="compute+graphics"), Process(103, 512, kind="mps"),
                ]),
                Device(1),
            ]
        )
    )  # fmt: skip
    got = run(
        fake,
        """
        N.nvmlInit()
        h0, h1 = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(1)
        out({"compute": procs(N.nvmlDeviceGetComputeRunningProcesses(h0)),
             "graphics": procs(N.nvmlDeviceGetGraphicsRunningProcesses(h0)),
             "mps": procs(N.nvmlDeviceGetMPSComputeRunningProcesses_v3(h0)),
             "empty": procs(N.nvmlDeviceGetComputeRunningProcesses(h1)),
             "used": N.nvmlDeviceGetMemoryInfo(h0).used})
        """,
    )
    assert got["compute"] == [[100, GIB, NO_ID, NO_ID], [102, 3 * GIB, NO_ID, NO_ID]]
    assert got["graphics"] == [[101, 2 * GIB, NO_ID, NO_ID], [102, 3 * GIB, NO_ID, NO_ID]]
    assert got["mps"] == [[103, 512, NO_ID, NO_ID]]
    assert got["empty"] == []
    assert got["used"] == 6 * GIB + 512


def test_jittered_samples_with_gaps_each_cover_the_time_since_the_one_before(
    fake: FakeNvml,
) -> None:
    now = time.time()
    pattern = Pattern.square(3, 30, origin=now - 12.4)
    fake.write(NvmlState(clock_offset_s=-1000.0, device_clock="epoch", idle_samples=True,
                         devices=[Device(0, util=pattern)]))
    got = run(
        fake,
        """
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        first = N.nvmlDeviceGetSamples(h, N.NVML_GPU_UTILIZATION_SAMPLES, 0)[1]
        seen = [[s.timeStamp, s.sampleValue.uiVal] for s in first]
        time.sleep(0.5)
        r = call(N.nvmlDeviceGetSamples, h, N.NVML_GPU_UTILIZATION_SAMPLES, seen[-1][0])
        seen += [[s.timeStamp, s.sampleValue.uiVal] for s in r[1]]
        out({"seen": seen})
        """,
    )
    offset_us = -1000 * 1_000_000
    stamps = [ts - offset_us for ts, _ in got["seen"]]  # back on the library's clock
    period_us = 167_000
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert stamps == sorted(set(stamps))
    assert any(ts % period_us for ts in stamps)  # not on the grid
    assert len(set(gaps)) > 3 and min(gaps) > 0 and max(gaps) < 3 * period_us  # jitter
    assert any(g > 1.5 * period_us for g in gaps)  # missing samples
    assert abs(stamps[-1] / 1e6 - time.time()) < 5  # the offset only shifts the stamps
    busy = sum((b - a) / 1e6 * v / 100 for (a, _), (b, v)
               in itertools.pairwise(zip(stamps, [v for _, v in got["seen"]], strict=True)))
    exact = pattern.integral(stamps[0] / 1e6, stamps[-1] / 1e6) / 100
    assert busy == pytest.approx(exact, abs=0.01)


def test_error_once_fails_one_call_then_the_call_works(fake: FakeNvml) -> None:
    fake.write(NvmlState(devices=[Device(0, power_w=100.0, errors_once={
        "nvmlDeviceGetTotalEnergyConsumption": "UNKNOWN"})]))
    got = run(
        fake,
        """
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        out([call(N.nvmlDeviceGetTotalEnergyConsumption, h) for _ in range(3)])
        """,
    )
    assert got[0] == "ERR:UNKNOWN"
    assert all(isinstance(v, int) for v in got[1:])


def test_samples_on_grid_once_and_exact(fake: FakeNvml) -> None:
    now = time.time()
    # 100 % for 3 s every 30 s, the busy part well inside the 20 s buffer.
    pattern = Pattern.square(3, 30, origin=now - 12.4)
    fake.write(NvmlState(sample_jitter=0, sample_missing_every=0, **IDEAL_DRIVER,
                         devices=[Device(0, util=pattern)]))
    got = run(
        fake,
        """
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        vtype, first = N.nvmlDeviceGetSamples(h, N.NVML_GPU_UTILIZATION_SAMPLES, 0)
        seen = [[s.timeStamp, s.sampleValue.uiVal] for s in first]
        calls, end = 0, time.monotonic() + 0.8
        while time.monotonic() < end:
            r = call(N.nvmlDeviceGetSamples, h, N.NVML_GPU_UTILIZATION_SAMPLES, seen[-1][0])
            calls += 1
            if isinstance(r, str):
                assert r == "ERR:NOT_FOUND", r
            else:
                seen += [[s.timeStamp, s.sampleValue.uiVal] for s in r[1]]
            time.sleep(0.02)
        future = call(N.nvmlDeviceGetSamples, h, 1, int((time.time() + 60) * 1e6))
        mem = N.nvmlDeviceGetSamples(h, N.NVML_MEMORY_UTILIZATION_SAMPLES, 0)[1]
        out({"vtype": vtype, "n_first": len(first), "seen": seen, "future": future,
             "mem": [s.sampleValue.uiVal for s in mem]})
        """,
    )
    period_us = 167_000
    assert got["vtype"] == 1  # NVML_VALUE_TYPE_UNSIGNED_INT
    assert got["n_first"] == 120
    stamps = [ts for ts, _ in got["seen"]]
    assert all(ts % period_us == 0 for ts in stamps)  # on the epoch-aligned grid
    assert stamps == sorted(set(stamps))  # each sample exactly once
    assert all(b - a == period_us for a, b in itertools.pairwise(stamps))
    assert len(stamps) >= 120 + 3  # new samples arrived while polling
    for ts, value in got["seen"]:
        t = ts / 1e6
        assert abs(value - pattern.mean(t - 0.167, t)) <= 0.5 + 1e-6
    busy = sum(v for _, v in got["seen"]) / 100 * 0.167
    exact = pattern.integral(stamps[0] / 1e6 - 0.167, stamps[-1] / 1e6) / 100
    assert exact == pytest.approx(3.0)
    assert busy == pytest.approx(exact, abs=0.002)
    assert got["future"] == "ERR:NOT_FOUND"
    assert max(got["mem"]) == 50


def test_time_scale_speeds_up_samples_energy_and_process_traces(fake: FakeNvml) -> None:
    """With time_scale 10 the library's clock runs 10x: sample stamps, pattern values,
    process samples and energy all follow it; an event wait's timeout stays real."""
    grid = {"sample_jitter": 0.0, "sample_missing_every": 0,  # full buffers, counted below
            **IDEAL_DRIVER}
    fake.write(NvmlState(time_scale=10.0, **grid, devices=[Device(0)]))  # fixes the origin
    t0 = fake.now()
    # 100 % for 3 NVML-s every 30 NVML-s (0.3 s busy every 3 s of real time).
    pattern = Pattern.square(3, 30, origin=t0 - 10)
    fake.write(
        NvmlState(
            time_scale=10.0, **grid,
            devices=[Device(0, power_w=100.0, processes=[
                Process(7, sm=Pattern.constant(40), start_time=t0 - 60)]),
                     Device(1, util=pattern)],
        )
    )  # fmt: skip
    got = run(
        fake,
        """
        N.nvmlInit()
        h0, h1 = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(1)
        es = N.nvmlEventSetCreate()
        N.nvmlDeviceRegisterEvents(h1, N.nvmlEventTypeXidCriticalError, es)
        r0 = time.time(); e0 = N.nvmlDeviceGetTotalEnergyConsumption(h0)
        first = N.nvmlDeviceGetSamples(h1, N.NVML_GPU_UTILIZATION_SAMPLES, 0)[1]
        r0_after = time.time()
        time.sleep(0.5)
        r1 = time.time(); e1 = N.nvmlDeviceGetTotalEnergyConsumption(h0)
        last = N.nvmlDeviceGetSamples(h1, N.NVML_GPU_UTILIZATION_SAMPLES, 0)[1]
        r1_after = time.time()
        procs = N.nvmlDeviceGetProcessUtilization(h0, 0)
        t = time.monotonic(); wait = call(N.nvmlEventSetWait_v2, es, 200)
        waited = time.monotonic() - t
        out({"r0": r0, "r1": r1, "r0_after": r0_after, "r1_after": r1_after, "de": e1 - e0,
             "first": [[s.timeStamp, s.sampleValue.uiVal] for s in first],
             "last": [[s.timeStamp, s.sampleValue.uiVal] for s in last],
             "proc_sm": sorted({p.smUtil for p in procs}),
             "proc_stamps": [p.timeStamp for p in procs],
             "wait": wait, "waited": waited})
        """,
    )
    period_us = 167_000
    # The newest sample is the one before the fake clock's "now", not the real one. The
    # call lies between the two real readings, and the fake clock runs 10x, so the bounds
    # are taken on each side of it.
    for stamps, before, after in ((got["first"], got["r0"], got["r0_after"]),
                                  (got["last"], got["r1"], got["r1_after"])):
        newest = stamps[-1][0] / 1e6
        assert fake.now(before) - 0.2 <= newest <= fake.now(after) + 1e-6
    advance = (got["last"][-1][0] - got["first"][-1][0]) / 1e6
    assert advance == pytest.approx(10 * (got["r1"] - got["r0"]), abs=0.5)
    # The buffer still holds 120 samples of 167 NVML-ms (2 real s) and follows the pattern.
    assert len(got["last"]) == 120
    assert all(b[0] - a[0] == period_us for a, b in itertools.pairwise(got["last"]))
    for ts, value in got["last"]:
        assert abs(value - pattern.mean(ts / 1e6 - 0.167, ts / 1e6)) <= 0.5 + 1e-6
    assert got["proc_sm"] == [40]
    assert max(got["proc_stamps"]) / 1e6 > got["r1"] + 1  # process samples on NVML time too
    assert got["de"] == pytest.approx(100.0 * 1000 * 10 * (got["r1"] - got["r0"]), rel=0.05)
    assert got["wait"] == "ERR:TIMEOUT" and 0.18 <= got["waited"] < 1.0  # real milliseconds
    with pytest.raises(ValueError, match="cannot change"):
        fake.write(NvmlState(time_scale=5.0, devices=[Device(0)]))


def test_utilization_rates_derived_from_processes(fake: FakeNvml) -> None:
    past = time.time() - 5
    sm = Pattern.constant
    fake.write(
        NvmlState(
            devices=[
                Device(0, processes=[Process(1, sm=sm(30), start_time=past),
                                     Process(2, sm=sm(50), start_time=past)]),
                Device(1, processes=[Process(3, sm=sm(70), start_time=past),
                                     Process(4, sm=sm(50), start_time=past)]),
                Device(2, util=sm(25), processes=[Process(5, sm=sm(90), start_time=past)]),
                Device(3, processes=[Process(6)]),
            ]
        )
    )  # fmt: skip
    got = run(
        fake,
        """
        N.nvmlInit()
        res = []
        for i in range(4):
            u = N.nvmlDeviceGetUtilizationRates(N.nvmlDeviceGetHandleByIndex(i))
            res.append([u.gpu, u.memory])
        out(res)
        """,
    )
    assert got == [[80, 40], [100, 50], [25, 13], [0, 0]]


def test_process_utilization(fake: FakeNvml) -> None:
    now = time.time()
    state = NvmlState(
        **IDEAL_DRIVER,
        devices=[
            Device(0, processes=[
                Process(10, sm=Pattern.constant(40), start_time=now - 3),
                Process(11, sm=Pattern.square(0.5, 1.0, origin=now - 3), start_time=now - 3),
                Process(12, sm=Pattern.constant(0), start_time=now - 3),
                Process(13),
            ]),
            Device(1, processes=[Process(20, sm=Pattern.constant(0), start_time=now - 3)]),
        ]
    )  # fmt: skip
    fake.write(state)
    body = """
        N.nvmlInit()
        h0, h1 = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(1)
        s = N.nvmlDeviceGetProcessUtilization(h0, 0)
        rows = [[x.pid, x.timeStamp, x.smUtil, x.memUtil, x.encUtil, x.decUtil] for x in s]
        last = max(r[1] for r in rows)
        nxt = call(N.nvmlDeviceGetProcessUtilization, h0, last)
        idle = call(N.nvmlDeviceGetProcessUtilization, h1, 0)
        out({"rows": rows, "idle": idle if isinstance(idle, str) else len(idle),
             "next_ok": isinstance(nxt, str) or all(x.timeStamp > last for x in nxt)})
    """
    got = run(fake, body)
    rows = got["rows"]
    assert {r[0] for r in rows} == {10, 11}  # 0 % samples and pattern-less processes absent
    p10 = [r for r in rows if r[0] == 10]
    stamps = [r[1] for r in p10]
    assert all(b - a == 167_000 for a, b in itertools.pairwise(stamps))
    assert len(p10) >= 15  # about 3 s of history
    assert all(r[2:] == [40, 20, 0, 0] for r in p10[1:])
    square = state.devices[0].processes[1].sm
    assert square is not None
    for _, ts, smv, *_ in (r for r in rows if r[0] == 11):
        assert abs(smv - square.mean(ts / 1e6 - 0.167, ts / 1e6)) <= 0.5 + 1e-6
    assert got["idle"] == "ERR:NOT_FOUND"
    assert got["next_ok"]

    # "latest": one sample per process; zero samples on request.
    state.process_util_mode = "latest"
    state.process_zero_samples = True
    fake.write(state)
    got = run(fake, body)
    assert sorted(r[0] for r in got["rows"]) == [10, 11, 12]
    assert got["idle"] == 1


def test_mig_handles_and_process_instances(fake: FakeNvml) -> None:
    fake.write(
        NvmlState(
            devices=[
                Device(0, mig=[
                    MigInstance(1, 0, uuid="MIG-1111", memory_total=20 * GIB,
                                memory_used=3 * GIB, name="NVIDIA A100-SXM4-80GB MIG 2g.20gb"),
                    MigInstance(2, 0, uuid="MIG-2222", memory_total=10 * GIB, memory_used=GIB),
                ], processes=[
                    Process(50, 3 * GIB, gpu_instance_id=1, compute_instance_id=0),
                    Process(51, GIB, gpu_instance_id=2, compute_instance_id=0),
                ]),
                Device(1),
            ]
        )
    )  # fmt: skip
    got = run(
        fake,
        """
        N.nvmlInit()
        h, plain = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(1)
        migs = []
        for i in range(N.nvmlDeviceGetMaxMigDeviceCount(h)):
            m = call(N.nvmlDeviceGetMigDeviceHandleByIndex, h, i)
            if isinstance(m, str):
                migs.append(m)
                continue
            mem = N.nvmlDeviceGetMemoryInfo(m)
            parent = N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
            migs.append([N.nvmlDeviceIsMigDeviceHandle(m).value, N.nvmlDeviceGetUUID(m),
                         N.nvmlDeviceGetName(m), N.nvmlDeviceGetGpuInstanceId(m),
                         N.nvmlDeviceGetComputeInstanceId(m), mem.total, mem.used,
                         N.nvmlDeviceGetIndex(parent),
                         procs(N.nvmlDeviceGetComputeRunningProcesses(m)),
                         call(N.nvmlDeviceGetPowerUsage, m)])
        bymig = N.nvmlDeviceGetHandleByUUID("MIG-2222")
        out({"mode": N.nvmlDeviceGetMigMode(h), "plain_mode": N.nvmlDeviceGetMigMode(plain),
             "plain_max": N.nvmlDeviceGetMaxMigDeviceCount(plain),
             "plain_is_mig": N.nvmlDeviceIsMigDeviceHandle(plain).value,
             "plain_gi": call(N.nvmlDeviceGetGpuInstanceId, plain),
             "migs": migs, "bymig": N.nvmlDeviceGetGpuInstanceId(bymig),
             "parent_procs": procs(N.nvmlDeviceGetComputeRunningProcesses(h)),
             "util": call(N.nvmlDeviceGetUtilizationRates, h),
             "samples": call(N.nvmlDeviceGetSamples, h, 1, 0),
             "putil": call(N.nvmlDeviceGetProcessUtilization, h, 0),
             "power": N.nvmlDeviceGetPowerUsage(h)})
        """,
    )
    assert got["mode"] == [1, 1]
    assert got["plain_mode"] == [0, 0]
    assert got["plain_max"] == 0 and got["plain_is_mig"] == 0
    assert got["plain_gi"] == "ERR:INVALID_ARGUMENT"
    assert got["migs"][0] == [
        1, "MIG-1111", "NVIDIA A100-SXM4-80GB MIG 2g.20gb", 1, 0,
        20 * GIB, 3 * GIB, 0, [[50, 3 * GIB, 1, 0]], "ERR:NOT_SUPPORTED",
    ]  # fmt: skip
    assert got["migs"][1][1:5] == ["MIG-2222", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 2, 0]
    assert got["migs"][1][8] == [[51, GIB, 2, 0]]
    assert got["migs"][2:] == ["ERR:NOT_FOUND"] * 5  # max is 7, two exist
    assert got["bymig"] == 2
    assert got["parent_procs"] == [[50, 3 * GIB, 1, 0], [51, GIB, 2, 0]]
    assert got["util"] == got["samples"] == got["putil"] == "ERR:NOT_SUPPORTED"
    assert got["power"] == 60000


def test_xid_event_delivered_once(fake: FakeNvml) -> None:
    old = XidEvent(1, 31, time=time.time() - 100)  # before registration: never delivered
    state = NvmlState(devices=[Device(0, xid_events=[old]), Device(1)])
    fake.write(state)
    proc = Interactive(
        fake,
        """
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        supported = N.nvmlDeviceGetSupportedEventTypes(h)
        es = N.nvmlEventSetCreate()
        N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError, es)
        N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(1),
                                   N.nvmlEventTypeXidCriticalError, es)
        before = call(N.nvmlEventSetWait, es, 50)
        sync()
        got = []
        t0 = time.time()
        for _ in range(3):
            e = call(N.nvmlEventSetWait, es, 2000)
            if isinstance(e, str):
                got.append(e)
                break
            got.append([N.nvmlDeviceGetIndex(e.device), e.eventType, e.eventData,
                        e.gpuInstanceId])
        timeout_wait = time.time() - t0
        N.nvmlEventSetFree(es)
        out({"supported": supported, "before": before, "got": got, "waited": timeout_wait})
        """,
    )
    proc.wait_ready()
    state.devices[0].xid_events.append(XidEvent(2, 79))
    state.devices[1].xid_events.append(XidEvent(7, 48))
    fake.write(state)
    proc.go()
    got, _ = proc.finish()
    assert got["supported"] & 0x8
    assert got["before"] == "ERR:TIMEOUT"
    assert got["got"] == [[0, 8, 79, NO_ID], [1, 8, 48, NO_ID], "ERR:TIMEOUT"]
    assert 1.9 < got["waited"] < 4


def test_injected_errors_and_lost_gpu(fake: FakeNvml) -> None:
    fake.write(
        NvmlState(
            errors={"nvmlSystemGetDriverVersion": "NO_PERMISSION"},
            devices=[
                Device(0, errors={"nvmlDeviceGetPowerUsage": "NOT_SUPPORTED",
                                  "nvmlDeviceGetMemoryInfo": "NO_PERMISSION"}),
                Device(1, lost=True),
                Device(2, errors={"*": "UNKNOWN"}),
            ],
        )
    )  # fmt: skip
    got = run(
        fake,
        """
        N.nvmlInit()
        h0, h2 = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(2)
        out({"power": call(N.nvmlDeviceGetPowerUsage, h0), "name": N.nvmlDeviceGetName(h0),
             "mem1": call(N.nvmlDeviceGetMemoryInfo, h0),
             "mem2": call(N.nvmlDeviceGetMemoryInfo, h0, version=N.nvmlMemory_v2),
             "lost": call(N.nvmlDeviceGetHandleByIndex, 1),
             "uuid_any_lost": call(N.nvmlDeviceGetHandleByUUID, N.nvmlDeviceGetUUID(h0)),
             "star": [call(N.nvmlDeviceGetName, h2), call(N.nvmlDeviceGetTemperature, h2, 0)],
             "driver": call(N.nvmlSystemGetDriverVersion),
             "count": N.nvmlDeviceGetCount()})
        """,
    )
    assert got["power"] == "ERR:NOT_SUPPORTED"
    assert got["name"] == "NVIDIA A100-SXM4-80GB"
    assert got["mem1"] == got["mem2"] == "ERR:NO_PERMISSION"
    assert got["lost"] == "ERR:GPU_IS_LOST"
    assert got["uuid_any_lost"] == "ERR:GPU_IS_LOST"  # as documented for real NVML
    assert got["star"] == ["ERR:UNKNOWN", "ERR:UNKNOWN"]
    assert got["driver"] == "ERR:NO_PERMISSION"
    assert got["count"] == 3


def test_init_error(fake: FakeNvml) -> None:
    fake.write(NvmlState(init_error="DRIVER_NOT_LOADED", devices=[Device(0)]))
    got = run(fake, "out(call(N.nvmlInit))")
    assert got == "ERR:DRIVER_NOT_LOADED"


def test_sleep_delays_only_that_call(fake: FakeNvml) -> None:
    fake.write(NvmlState(devices=[Device(0, sleeps={"nvmlDeviceGetPowerUsage": 1.0})]))
    got = run(
        fake,
        """
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        took = {}
        def slow():
            t = time.time(); N.nvmlDeviceGetPowerUsage(h); took["power"] = time.time() - t
        th = threading.Thread(target=slow); th.start()
        time.sleep(0.1)
        t = time.time()
        for _ in range(20):
            N.nvmlDeviceGetName(h); N.nvmlDeviceGetMemoryInfo(h)
        took["others"] = time.time() - t
        took["others_done_first"] = "power" not in took
        th.join()
        out(took)
        """,
    )
    assert 0.95 <= got["power"] < 3
    assert got["others"] < 0.3
    assert got["others_done_first"]


def test_state_rewrite_seen_by_running_process(fake: FakeNvml) -> None:
    state = NvmlState(devices=[Device(0, memory_used=GIB, power_w=100.0), Device(1)])
    fake.write(state)
    proc = Interactive(
        fake,
        """
        N.nvmlInit()
        h0, h1 = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(1)
        def look():
            return [call(lambda: N.nvmlDeviceGetMemoryInfo(h0).used),
                    call(N.nvmlDeviceGetName, h0), call(N.nvmlDeviceGetPowerUsage, h0),
                    call(N.nvmlDeviceGetTotalEnergyConsumption, h0),
                    call(N.nvmlDeviceGetName, h1), call(N.nvmlDeviceGetCount)]
        phases = [look()]
        sync()
        phases.append(look())
        sync()
        phases.append(look())
        phases.append(look())
        sync()
        phases.append(look())
        out(phases)
        """,
    )
    proc.wait_ready()
    state.devices = [Device(0, memory_used=3 * GIB, power_w=300.0, name="Renamed GPU")]
    fake.write(state)
    proc.go()
    proc.wait_ready()
    fake.write_raw("fakenvml 1\ndevice 0\nmemory_total lots\n")
    proc.go()
    proc.wait_ready()
    state.devices[0].lost = True
    fake.write(state)
    proc.go()
    phases, err = proc.finish()
    first, second, bad1, bad2, lost = phases
    assert first[:3] == [GIB, "NVIDIA A100-SXM4-80GB", 100000]
    assert first[4:] == ["NVIDIA A100-SXM4-80GB", 2]
    assert second[:3] == [3 * GIB, "Renamed GPU", 300000]
    assert second[3] >= first[3]  # energy keeps counting across the rewrite
    assert second[4:] == ["ERR:GPU_IS_LOST", 1]  # a vanished GPU's handle is lost
    assert bad1 == bad2 == ["ERR:UNKNOWN"] * 6
    assert lost[:5] == ["ERR:GPU_IS_LOST"] * 5 and lost[5] == 1
    bad_lines = [line for line in err.splitlines() if "fake-nvml" in line]
    assert len(bad_lines) == 1 and ":3:" in bad_lines[0]  # reported once, with its line


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (None, "DRIVER_NOT_LOADED"),
        ("", "UNKNOWN"),
        ("hello world\n", "UNKNOWN"),
        ("fakenvml 1\ndevice 0\nuuid GPU-x\nutil 0 5 1 3:150\n", "UNKNOWN"),
        ("fakenvml 1\ndevice 99\n", "UNKNOWN"),
        ("fakenvml 1\nsurprise 1\n", "UNKNOWN"),
        ("\x00\xff" * 1000, "UNKNOWN"),
    ],
)
def test_bad_state_file_is_an_nvml_error(fake: FakeNvml, content: str | None, error: str) -> None:
    if content is not None:
        fake.write_raw(content)
    proc = subprocess.run(
        _script("out([call(N.nvmlInit), call(N.nvmlInit)])"),
        env=fake.env(),
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [f"ERR:{error}"] * 2
    assert len([ln for ln in proc.stderr.splitlines() if ln.startswith("fake-nvml: ")]) == 1
