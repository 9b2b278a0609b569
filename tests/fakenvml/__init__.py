"""A fake ``libnvidia-ml.so.1`` for tests, driven by a state file.

The library is built from ``fake_nvml.c`` with the system C compiler and the
``nvml.h`` shipped by the ``nvidia-nvml-dev`` package.  A program started with
:meth:`FakeNvml.env` loads it instead of the real NVML (through
``LD_LIBRARY_PATH``), so the real nvidia-ml-py talks to it.  Tests describe the
node with the dataclasses below and call :meth:`FakeNvml.write` whenever it
should change; the library notices the new file on its next call.

Utilization is described by :class:`Pattern` traces over wall-clock time, and
the library answers the sample-buffer calls (``nvmlDeviceGetSamples``,
``nvmlDeviceGetProcessUtilization``) with the exact mean of the trace over each
sample period, so tests can compute the true busy time with
:meth:`Pattern.integral`.  ``NvmlState.time_scale`` makes the library's clock
run faster than the real one (minutes of NVML time in seconds of a test);
:meth:`FakeNvml.now` reads that clock.  See README.md for the file format.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Literal

__all__ = [
    "ERROR_NAMES",
    "GPM_METRICS",
    "IDEAL_DRIVER",
    "THROTTLE_POLICIES",
    "Device",
    "FakeNvml",
    "FakeNvmlUnavailable",
    "MigInstance",
    "NvmlState",
    "Pattern",
    "Process",
    "XidEvent",
    "build_library",
    "duty_active_s",
    "fake_nvml_or_skip",
    "find_nvml_header",
]

SOURCE = Path(__file__).with_name("fake_nvml.c")
LIB_NAME = "libnvidia-ml.so.1"
# A device buffer's ring reaches back at most this many times buffer_samples sample
# periods (RING_REACH in fake_nvml.c): the pattern history kept covers that much.
RING_REACH = 64
CFLAGS = (
    "-std=c11",
    "-shared",
    "-fPIC",
    "-O2",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-pthread",
    f"-Wl,-soname,{LIB_NAME}",
)

#: Throttle reasons a Device may list, by their NVML_PERF_POLICY_* number.
THROTTLE_POLICIES = {"power": 0, "thermal": 1, "sync_boost": 2, "board_limit": 3,
                     "low_utilization": 4, "reliability": 5, "app_clocks": 10,
                     "base_clocks": 11}
THROTTLE_PERIOD_S = 1.0  # THROTTLE_PERIOD_S in fake_nvml.c


def duty_active_s(dt: float, fraction: float) -> float:
    """Seconds a reason active the first ``fraction`` of each second since its origin
    was active in ``dt`` seconds from it (duty_active_s in fake_nvml.c)."""
    if dt <= 0:
        return 0.0
    periods = math.floor(dt / THROTTLE_PERIOD_S)
    rest = dt - periods * THROTTLE_PERIOD_S
    on = fraction * THROTTLE_PERIOD_S
    return periods * on + min(rest, on)


#: Error names accepted in ``errors``/``init_error`` (NVML_ERROR_<name>).
ERROR_NAMES = frozenset(
    {
        "UNINITIALIZED", "INVALID_ARGUMENT", "NOT_SUPPORTED", "NO_PERMISSION",
        "ALREADY_INITIALIZED", "NOT_FOUND", "INSUFFICIENT_SIZE", "INSUFFICIENT_POWER",
        "DRIVER_NOT_LOADED", "TIMEOUT", "IRQ_ISSUE", "LIBRARY_NOT_FOUND",
        "FUNCTION_NOT_FOUND", "CORRUPTED_INFOROM", "GPU_IS_LOST", "RESET_REQUIRED",
        "OPERATING_SYSTEM", "LIB_RM_VERSION_MISMATCH", "IN_USE", "MEMORY", "NO_DATA",
        "INSUFFICIENT_RESOURCES", "ARGUMENT_VERSION_MISMATCH", "DEPRECATED", "NOT_READY",
        "GPU_NOT_FOUND", "INVALID_STATE", "UNKNOWN",
    }
)  # fmt: skip

ProcessKind = Literal["compute", "graphics", "mps", "compute+graphics"]


class FakeNvmlUnavailable(RuntimeError):
    """The fake library cannot be built here (no C compiler or no nvml.h)."""


# --------------------------------------------------------------------- model


@dataclass
class Pattern:
    """A piecewise-constant utilization trace, in percent, over wall-clock time.

    ``segments`` are ``(duration_s, percent)`` pairs starting at ``origin``
    (epoch seconds).  With ``repeat`` the sequence repeats forever in both
    directions; without it the value is 0 outside ``[origin, origin + period)``.
    """

    segments: list[tuple[float, float]]
    origin: float = 0.0
    repeat: bool = True

    def __post_init__(self) -> None:
        if not self.segments:
            raise ValueError("a Pattern needs at least one segment")
        for dur, pct in self.segments:
            if not (dur > 0 and math.isfinite(dur)):
                raise ValueError(f"segment duration must be > 0, got {dur!r}")
            if not 0 <= pct <= 100:
                raise ValueError(f"segment percent must be within 0..100, got {pct!r}")
        if not math.isfinite(self.origin):
            raise ValueError("origin must be finite")

    @classmethod
    def constant(cls, percent: float) -> Pattern:
        """The same value at every instant."""
        return cls([(1.0, float(percent))], 0.0, True)

    @classmethod
    def square(
        cls, busy_s: float, period_s: float, percent: float = 100.0, origin: float = 0.0
    ) -> Pattern:
        """``percent`` for ``busy_s`` seconds, then 0 until ``period_s``, repeating."""
        if not 0 < busy_s < period_s:
            raise ValueError("need 0 < busy_s < period_s")
        return cls([(busy_s, percent), (period_s - busy_s, 0.0)], origin, True)

    @property
    def period(self) -> float:
        """Length of one pass over the segments, in seconds."""
        return sum(d for d, _ in self.segments)

    def value_at(self, t: float) -> float:
        """The percent at epoch time ``t``."""
        u = t - self.origin
        if self.repeat:
            u -= math.floor(u / self.period) * self.period
        elif not 0 <= u < self.period:
            return 0.0
        c = 0.0
        for dur, pct in self.segments:
            c += dur
            if u < c:
                return pct
        return self.segments[-1][1]

    def _cumulative(self, t: float) -> float:
        """Integral of the trace from ``origin`` to ``t`` (percent-seconds)."""
        per = self.period
        u = t - self.origin
        whole = 0.0
        if self.repeat:
            n = math.floor(u / per)
            whole = n * sum(d * p for d, p in self.segments)
            u -= n * per
        else:
            u = min(max(u, 0.0), per)
        acc, c = 0.0, 0.0
        for dur, pct in self.segments:
            if u <= c:
                break
            acc += pct * (min(u, c + dur) - c)
            c += dur
        return whole + acc

    def integral(self, a: float, b: float) -> float:
        """Exact integral over ``[a, b]`` in percent-seconds (100 = one busy second)."""
        return self._cumulative(b) - self._cumulative(a)

    def mean(self, a: float, b: float) -> float:
        """Exact mean percent over ``(a, b]``."""
        return self.integral(a, b) / (b - a) if b > a else 0.0


#: GPM metrics the fake reports, by the names tests use: NVML_GPM_METRIC_* ids.
#: Activities are percent (0..100); the traffic metrics (``pcie_*``, ``nvlink_*``)
#: MiB/s, for whole GPUs only.
GPM_METRICS = {
    "graphics": 1, "sm_util": 2, "sm_occupancy": 3, "integer": 4, "tensor": 5,
    "dfma_tensor": 6, "hmma_tensor": 7, "imma_tensor": 9, "dram": 10, "fp64": 11,
    "fp32": 12, "fp16": 13, "pcie_tx": 20, "pcie_rx": 21, "nvlink_rx": 60, "nvlink_tx": 61,
}  # fmt: skip
_GPM_TRAFFIC = frozenset({"pcie_tx", "pcie_rx", "nvlink_rx", "nvlink_tx"})

#: A GPM trace: a Pattern (percent), or a constant (percent, or MiB/s for traffic).
GpmTrace = Pattern | float


@dataclass
class Process:
    """A process with a GPU context.

    ``sm`` drives ``nvmlDeviceGetProcessUtilization`` (and the device's
    utilization when ``Device.util`` is None); a process without it reports no
    utilization samples.  ``start_time`` is when its trace begins (epoch s;
    None: the first :meth:`FakeNvml.write` that lists it).
    """

    pid: int
    used_memory: int = 0
    kind: ProcessKind = "compute"
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    sm: Pattern | None = None
    start_time: float | None = None
    # smUtil reported = sm_scale x the true mean, not capped at 100 (drivers have been
    # seen reporting 130 %).
    sm_scale: float = 1.0
    # About one read in this many (0: none) also returns a garbage sample of it: smUtil
    # 37100 stamped 7 years ahead of the others, as nvtop issue 110 saw drivers return.
    garbage_every: int = 0


@dataclass
class MigInstance:
    """A MIG device (one compute instance of one GPU instance)."""

    gpu_instance_id: int
    compute_instance_id: int = 0
    uuid: str = ""  # "": derived from the parent's index and the ids
    memory_total: int = 10 * 1024**3
    memory_used: int = 0
    name: str = "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    # GPM traces of this GPU instance (answered when the parent has ``gpm``).
    gpm: dict[str, GpmTrace] = field(default_factory=dict)


@dataclass
class XidEvent:
    """An Xid error.  ``seq`` must be unique and increase within a device.

    ``time`` is when it happened (epoch s; None: when first written).  Event
    sets registered after that time do not get it, as with real NVML; 0 means
    "deliver to every set".
    """

    seq: int
    xid: int
    time: float | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass
class Device:
    """One GPU.  Only ``index`` is required; the rest has plausible defaults.

    ``memory_used`` None means the sum of the processes' memory.  ``util`` None
    means derived: ``min(100, sum of the processes' sm)`` at each instant.
    Energy is ``energy_base_mj + power_w * 1000 * (now - energy_origin)``;
    with ``energy_origin`` None, the first write starts the counter at
    ``energy_base_mj`` and later writes continue it (a power change applies
    from that write on).  ``energy_reset_at`` (NVML time; None: never) is a
    driver reload or GPU reset: the counter restarts at ``energy_base_mj`` then,
    lower than it read before, and later writes continue from there.
    ``errors`` maps an NVML function name (or "*") to
    an error name; ``sleeps`` maps a function name (or "*") to seconds of
    delay before it answers.  A name without its ``_vN`` suffix also matches
    the versioned symbol.
    """

    index: int
    uuid: str = ""
    minor: int | None = None
    name: str = "NVIDIA A100-SXM4-80GB"
    pci_bus_id: str = ""
    serial: str = ""
    pci_device_id: int = 0x20B210DE
    pci_subsystem_id: int = 0x147F10DE
    memory_total: int = 80 * 1024**3
    memory_reserved: int = 0
    memory_used: int | None = None
    power_w: float = 60.0
    energy_base_mj: int = 0
    energy_origin: float | None = None
    energy_reset_at: float | None = None  # the counter restarted at energy_base_mj then
    temperature_c: int = 35
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    processes: list[Process] = field(default_factory=list)
    util: Pattern | None = None
    mig: list[MigInstance] = field(default_factory=list)
    mig_on: bool = False  # MIG mode enabled with no instances yet (instances: always on)
    xid_events: list[XidEvent] = field(default_factory=list)
    lost: bool = False
    errors: dict[str, str] = field(default_factory=dict)
    sleeps: dict[str, float] = field(default_factory=dict)
    errors_once: dict[str, str] = field(default_factory=dict)  # the next call fails, once
    # GPM (Hopper and later): None = not supported; else traces by GPM_METRICS name
    # (a metric not listed reads 0).
    gpm: dict[str, GpmTrace] | None = None
    # Throttling: the share of the time (0..1) each reason (THROTTLE_POLICIES) holds the
    # clocks down, active the first part of every second; a reason not listed answers
    # NOT_SUPPORTED (None: none is supported). Violation counters start at
    # ``violation_base_ns`` and continue across writes (a new share applies from then).
    throttle: dict[str, float] | None = None
    violation_base_ns: int = 0
    sm_clock_mhz: int | None = 1410  # None: nvmlDeviceGetClockInfo answers NOT_SUPPORTED
    sm_clock_max_mhz: int = 1410
    # None: the call answers NOT_SUPPORTED. Rows: (correctable, uncorrectable, pending,
    # failure); NVLink errors: link -> (replay, recovery, crc_flit, crc_data).
    remapped_rows: tuple[int, int, int, int] | None = None
    pcie_replays: int | None = None
    nvlink_errors: dict[int, tuple[int, int, int, int]] | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.index < 64:
            raise ValueError("device index must be within 0..63")
        if not self.uuid:
            self.uuid = f"GPU-{self.index:08x}-fa4e-4c0d-9000-{self.index:012x}"
        if self.minor is None:
            self.minor = self.index
        if not self.pci_bus_id:
            self.pci_bus_id = f"00000000:{0x10 + self.index:02X}:00.0"
        if not self.serial:
            self.serial = f"16500{self.index:08d}"


@dataclass
class NvmlState:
    """Everything the fake library reports.

    ``process_util_mode`` "grid" gives one process sample per sample period;
    "latest" gives only each process's newest sample (closer to what drivers
    have been seen to return).  Samples of 0 % are left out, as the driver
    does, unless ``process_zero_samples``.  ``errors``/``sleeps`` here apply to
    every call, device or not (e.g. ``nvmlDeviceGetCount_v2``).

    ``time_scale`` speeds up the library's clock: it reads
    ``origin + (real - origin) * time_scale``, and every timestamp, pattern
    evaluation, energy value and Xid/process start time runs on it (so all
    the epoch times a test passes in are NVML times; :meth:`FakeNvml.now`
    gives the current one).  ``time_origin`` is the real epoch time where both
    clocks agree; None means the real time of the first write.  Timeouts and
    injected ``sleeps`` stay in real seconds.  Neither may change between
    writes of one :class:`FakeNvml` (the clock would jump).
    """

    devices: list[Device] = field(default_factory=list)
    driver_version: str = "550.54.15"
    nvml_version: str | None = None  # None: "12." + driver_version
    cuda_driver_version: int = 12040
    sample_period_ms: int = 167
    buffer_samples: int = 120
    init_error: str | None = None
    errors: dict[str, str] = field(default_factory=dict)
    sleeps: dict[str, float] = field(default_factory=dict)
    process_util_mode: Literal["grid", "latest"] = "latest"
    process_zero_samples: bool = False
    time_scale: float = 1.0
    time_origin: float | None = None  # real epoch s; None: the first write
    errors_once: dict[str, str] = field(default_factory=dict)  # the next call fails, once
    # Device samples come up to this fraction of a period late, and about one in
    # ``sample_missing_every`` is missing (0: none), as on real drivers.
    sample_jitter: float = 0.3
    sample_missing_every: int = 7
    clock_offset_s: float = 0.0  # added to every sample timestamp (a driver on another clock)
    # What public reports say real drivers do (README.md, "Real-driver defaults"); each
    # can be switched back: device_clock="epoch", idle_samples=True, process_stagger_s=0,
    # process_util_mode="grid", energy_step_ms=0.
    device_clock: Literal["boot", "epoch"] = "boot"  # device samples: CLOCK_BOOTTIME µs
    process_clock: Literal["boot", "epoch"] = "epoch"  # process samples: epoch µs
    boot_time: float | None = None  # NVML time of the boot (None: the host's boot)
    idle_samples: bool = False  # False: no device samples while the GPU is idle
    process_stagger_s: float = 4.5  # PID's samples come (PID % 10) / 9 of this late
    energy_step_ms: float = 100.0  # the energy counter moves in steps this far apart


#: NvmlState arguments that switch the real-driver defaults back to an idealised
#: driver: epoch device timestamps, samples while idle, one process sample per period
#: on the grid, a smooth energy counter.
IDEAL_DRIVER: dict[str, object] = {
    "device_clock": "epoch", "idle_samples": True, "process_stagger_s": 0.0,
    "process_util_mode": "grid", "energy_step_ms": 0.0,
}  # fmt: skip


# ------------------------------------------------------------------- build

_BUILT: dict[str, Path] = {}


def find_nvml_header() -> Path:
    """Locate ``nvml.h``: $NVML_INCLUDE_DIR, then the nvidia-nvml-dev package."""
    override = os.environ.get("NVML_INCLUDE_DIR")
    if override:
        header = Path(override) / "nvml.h"
        if header.is_file():
            return header
        raise FakeNvmlUnavailable(f"NVML_INCLUDE_DIR is set but has no nvml.h: {override}")
    try:
        dist = metadata.distribution("nvidia-nvml-dev")
    except metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        for f in dist.files or ():
            if f.name == "nvml.h":
                header = Path(str(dist.locate_file(f)))
                if header.is_file():
                    return header
    raise FakeNvmlUnavailable(
        "nvml.h not found: install nvidia-nvml-dev (the project's 'test' extra) "
        "or set NVML_INCLUDE_DIR"
    )


def _find_compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise FakeNvmlUnavailable("no C compiler found (install gcc, or set CC)")
    return cc


def _cache_root() -> Path:
    # As root, under /var/tmp: a Slurm release's root (slurm-testcluster) has /var/tmp at
    # the same path, so an agent that runs there loads the same library.
    base = "/var/tmp" if os.geteuid() == 0 else (
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"))
    root = Path(base) / "slurm-gpu-exporter" / "fakenvml"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    root = Path(tempfile.gettempdir()) / f"slurm-gpu-exporter-fakenvml-{os.getuid()}"
    root.mkdir(parents=True, exist_ok=True)
    return root


def build_library(cache_dir: Path | None = None) -> Path:
    """Compile the fake library (once per source version) and return its directory.

    The output lands in a cache directory keyed by a hash of the source, the
    header and the flags, never in the repository.  Raises
    :class:`FakeNvmlUnavailable` when the compiler or ``nvml.h`` is missing and
    :class:`RuntimeError` when compilation fails.
    """
    header = find_nvml_header()
    cc = _find_compiler()
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), header.read_bytes(), " ".join((cc, *CFLAGS)).encode()):
        digest.update(part)
        digest.update(b"\0")
    key = digest.hexdigest()[:16]
    if key in _BUILT and (_BUILT[key] / LIB_NAME).is_file():
        return _BUILT[key]
    out_dir = (cache_dir or _cache_root()) / key
    lib = out_dir / LIB_NAME
    if not lib.is_file():
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out_dir / f".{LIB_NAME}.{os.getpid()}.tmp"
        cmd = [cc, *CFLAGS, f"-I{header.parent}", "-o", str(tmp), str(SOURCE), "-lm"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        except OSError as exc:
            raise FakeNvmlUnavailable(f"cannot run the C compiler {cc!r}: {exc}") from exc
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(
                f"building the fake NVML library failed ({' '.join(cmd)}):\n{proc.stderr}"
            )
        os.replace(tmp, lib)  # atomic: parallel builders never see half a file
    _BUILT[key] = out_dir
    return out_dir


# -------------------------------------------------------------- state file


def _word(value: str, what: str) -> str:
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"{what} must be one word without spaces: {value!r}")
    return value


def _text(value: str, what: str) -> str:
    if not value.strip() or "\n" in value or "\r" in value:
        raise ValueError(f"{what} must be one non-empty line: {value!r}")
    return value.strip()


def _error(name: str) -> str:
    short = name.removeprefix("NVML_ERROR_")
    if short not in ERROR_NAMES:
        raise ValueError(f"unknown NVML error name {name!r}")
    return short


def _id(value: int | None) -> str:
    return "-" if value is None else str(int(value))


def _trace(key: str, start: float, pattern: Pattern | None, none_word: str) -> str:
    if pattern is None:
        return f"{key} {start!r} {none_word}"
    segs = " ".join(f"{float(d)!r}:{float(p)!r}" for d, p in pattern.segments)
    return f"{key} {start!r} {float(pattern.origin)!r} {int(pattern.repeat)} {segs}"


def _injections(errors: Mapping[str, str], sleeps: Mapping[str, float],
                errors_once: Mapping[str, str]) -> list[str]:
    lines = [f"error {_word(fn, 'function name')} {_error(e)}" for fn, e in errors.items()]
    lines += [f"error_once {_word(fn, 'function name')} {_error(e)}"
              for fn, e in errors_once.items()]
    for fn, secs in sleeps.items():
        if not 0 <= secs <= 3600:
            raise ValueError(f"sleep for {fn} must be within 0..3600 s")
        lines.append(f"sleep {_word(fn, 'function name')} {float(secs)!r}")
    return lines


_History = list[tuple[float, "Pattern | None"]]


def _gpm_pattern(name: str, trace: GpmTrace) -> Pattern:
    """A trace as a Pattern; a constant traffic rate may exceed 100 (MiB/s)."""
    if isinstance(trace, Pattern):
        return trace
    value = float(trace)
    limit = 1e9 if name in _GPM_TRAFFIC else 100.0
    if not 0 <= value <= limit:
        raise ValueError(f"GPM {name} must be within 0..{limit:g}, got {value!r}")
    pattern = Pattern.constant(0.0)
    pattern.segments = [(1.0, value)]  # past Pattern's 0..100 check: MiB/s
    return pattern


class FakeNvml:
    """One fake node: a state file in ``workdir`` and the library that reads it."""

    def __init__(self, workdir: Path) -> None:
        """Use ``workdir`` (created if needed) for the state file."""
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.state_path = self.workdir / "nvml-state"
        self._lib_dir: Path | None = None
        self._util: dict[str, _History] = {}
        self._psm: dict[tuple[str, int], _History] = {}
        self._gpm: dict[tuple[str, str, str], _History] = {}  # (uuid, gi, metric)
        self._live_gpm: set[tuple[str, str, str]] = set()
        self._energy: dict[str, tuple[float, float, float]] = {}
        self._violation: dict[tuple[str, str], tuple[float, float, float]] = {}
        self._xid_time: dict[tuple[str, int], float] = {}
        self._last_mtime_ns = 0
        self._clock: tuple[float, float] | None = None  # (scale, origin) once written

    @property
    def lib_dir(self) -> Path:
        """Directory holding ``libnvidia-ml.so.1`` (built on first use)."""
        return self.build()

    def build(self) -> Path:
        """Build the library if needed; return the directory that holds it."""
        if self._lib_dir is None:
            self._lib_dir = build_library()
        return self._lib_dir

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """A full environment (``base`` or os.environ) that loads the fake NVML.

        Adds ``LD_LIBRARY_PATH=<lib_dir>[:existing]`` and
        ``FAKE_NVML_STATE=<state_path>``.  It takes effect only in a new process.
        """
        env = dict(os.environ if base is None else base)
        old = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = f"{self.lib_dir}:{old}" if old else str(self.lib_dir)
        env["FAKE_NVML_STATE"] = str(self.state_path)
        return env

    def now(self, real: float | None = None) -> float:
        """The library's clock (NVML time, epoch s) at real time ``real`` (default: now).

        The real clock until the first write; then, with ``time_scale`` S and
        origin O, ``O + (real - O) * S``.
        """
        real = time.time() if real is None else real
        if self._clock is None:
            return real
        scale, origin = self._clock
        return real if scale == 1.0 else origin + (real - origin) * scale

    @staticmethod
    def _clock_of(state: NvmlState, real: float) -> tuple[float, float]:
        """(scale, origin) that ``state`` asks for, a None origin taken as ``real``."""
        scale = float(state.time_scale)
        if not (math.isfinite(scale) and 0 < scale <= 1e6):
            raise ValueError("time_scale must be within (0, 1e6]")
        origin = real if state.time_origin is None else float(state.time_origin)
        if not (math.isfinite(origin) and origin >= 0):
            raise ValueError("time_origin must be an epoch time >= 0")
        return scale, origin

    def _set_clock(self, state: NvmlState, real: float) -> None:
        wanted = self._clock_of(state, real)
        if self._clock is None:
            self._clock = wanted
        elif self._clock[0] != wanted[0] or (
            state.time_origin is not None and wanted[1] != self._clock[1]
        ):
            raise ValueError("time_scale/time_origin cannot change between writes "
                             "(the fake clock would jump); use a new FakeNvml")

    def write(self, state: NvmlState) -> None:
        """Atomically replace the state file with ``state``.

        Keeps the history the library needs so that values already in its
        sample buffers do not change: a changed utilization pattern applies
        from this call on, energy counters continue, and Xid events keep the
        time they were first written.
        """
        self._set_clock(state, time.time())
        text = self.render(state, self.now())
        tmp = self.state_path.with_name(f".{self.state_path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        # A strictly newer mtime makes every version distinguishable even if
        # the filesystem reuses an inode number within one clock tick.
        mtime = max(time.time_ns(), self._last_mtime_ns + 1000)
        self._last_mtime_ns = mtime
        os.utime(tmp, ns=(mtime, mtime))
        os.replace(tmp, self.state_path)

    def write_raw(self, text: str) -> None:
        """Atomically replace the state file with ``text`` as is (for odd inputs)."""
        tmp = self.state_path.with_name(f".{self.state_path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        mtime = max(time.time_ns(), self._last_mtime_ns + 1000)
        self._last_mtime_ns = mtime
        os.utime(tmp, ns=(mtime, mtime))
        os.replace(tmp, self.state_path)

    # -- rendering

    def _history(self, hist: _History, pattern: Pattern | None, start: float, now: float,
                 horizon: float) -> _History:  # fmt: skip
        if not hist:
            hist.append((start, pattern))
        elif hist[-1][1] != pattern:
            hist.append((max(now, hist[-1][0]), pattern))
        # Entries superseded before the oldest instant any buffer can reach
        # are never read again.
        while len(hist) > 1 and hist[1][0] <= now - horizon:
            hist.pop(0)
        return hist

    def render(self, state: NvmlState, now: float | None = None) -> str:
        """The state file text for ``state`` (updating the kept history).

        ``now`` is NVML time (default :meth:`now`).
        """
        real = time.time()
        scale, origin = self._clock or self._clock_of(state, real)
        if now is None:
            now = real if scale == 1.0 else origin + (real - origin) * scale
        if not 1 <= state.sample_period_ms <= 600_000:
            raise ValueError("sample_period_ms must be within 1..600000")
        if not 1 <= state.buffer_samples <= 100_000:
            raise ValueError("buffer_samples must be within 1..100000")
        if state.process_util_mode not in ("grid", "latest"):
            raise ValueError("process_util_mode must be 'grid' or 'latest'")
        horizon = RING_REACH * state.buffer_samples * state.sample_period_ms / 1000.0 + 60.0
        out = [
            "fakenvml 1",
            f"driver_version {_word(state.driver_version, 'driver_version')}",
            f"cuda_driver_version {int(state.cuda_driver_version)}",
            f"sample_period_ms {int(state.sample_period_ms)}",
            f"buffer_samples {int(state.buffer_samples)}",
            f"process_util_mode {state.process_util_mode}",
            f"process_zero_samples {int(state.process_zero_samples)}",
        ]
        if state.nvml_version:
            out.append(f"nvml_version {_word(state.nvml_version, 'nvml_version')}")
        if state.init_error:
            out.append(f"init_error {_error(state.init_error)}")
        if scale != 1.0:
            out.append(f"time_scale {scale!r} {origin!r}")
        if not 0 <= state.sample_jitter <= 0.9 or state.sample_missing_every in (1,) \
                or not 0 <= state.sample_missing_every <= 1_000_000:
            raise ValueError("sample_jitter must be within 0..0.9 and sample_missing_every "
                             "0 or 2..1000000")
        out.append(f"sample_jitter {float(state.sample_jitter)!r} "
                   f"{int(state.sample_missing_every)}")
        if state.clock_offset_s:
            out.append(f"clock_offset {float(state.clock_offset_s)!r}")
        for key, clock in (("device_clock", state.device_clock),
                           ("process_clock", state.process_clock)):
            if clock not in ("boot", "epoch"):
                raise ValueError(f"{key} must be 'boot' or 'epoch'")
            out.append(f"{key} {clock}")
        if state.boot_time is not None:
            if not (math.isfinite(state.boot_time) and 0 <= state.boot_time < 1e11):
                raise ValueError("boot_time must be an epoch time >= 0")
            out.append(f"boot_time {float(state.boot_time)!r}")
        if not 0 <= state.process_stagger_s <= 3600:
            raise ValueError("process_stagger_s must be within 0..3600")
        if not 0 <= state.energy_step_ms <= 3_600_000:
            raise ValueError("energy_step_ms must be within 0..3600000")
        out += [f"idle_samples {int(state.idle_samples)}",
                f"process_stagger {float(state.process_stagger_s)!r}",
                f"energy_step_ms {float(state.energy_step_ms)!r}"]
        out += _injections(state.errors, state.sleeps, state.errors_once)

        seen_idx: set[int] = set()
        seen_uuid: set[str] = set()
        live_util: set[str] = set()
        live_psm: set[tuple[str, int]] = set()
        self._live_gpm: set[tuple[str, str, str]] = set()
        for dev in state.devices:
            if dev.index in seen_idx:
                raise ValueError(f"duplicate device index {dev.index}")
            if dev.uuid in seen_uuid:
                raise ValueError(f"duplicate device uuid {dev.uuid}")
            seen_idx.add(dev.index)
            seen_uuid.add(dev.uuid)
            out += self._render_device(dev, now, horizon)
            live_util.add(dev.uuid)
            live_psm.update((dev.uuid, p.pid) for p in dev.processes)
        # Forget the history of devices and processes that are gone.
        for key in set(self._util) - live_util:
            del self._util[key]
        for vkey in [k for k in self._violation if k[0] not in live_util]:
            del self._violation[vkey]
        for pkey in set(self._psm) - live_psm:
            del self._psm[pkey]
        for gkey in set(self._gpm) - self._live_gpm:
            del self._gpm[gkey]
        return "\n".join(out) + "\n"

    def _render_device(self, dev: Device, now: float, horizon: float) -> list[str]:
        uid = _word(dev.uuid, "uuid")
        out = [
            f"device {dev.index}",
            f"uuid {uid}",
            f"minor {int(dev.minor if dev.minor is not None else dev.index)}",
            f"name {_text(dev.name, 'name')}",
            f"serial {_word(dev.serial, 'serial')}",
            f"pci_bus_id {_word(dev.pci_bus_id, 'pci_bus_id')}",
            f"pci_device_id {int(dev.pci_device_id):#x}",
            f"pci_subsystem_id {int(dev.pci_subsystem_id):#x}",
            f"memory_total {int(dev.memory_total)}",
            f"memory_reserved {int(dev.memory_reserved)}",
            "memory_used " + ("auto" if dev.memory_used is None else str(int(dev.memory_used))),
            f"power_w {float(dev.power_w)!r}",
        ]
        # Energy: continue the counter across rewrites unless pinned or reset since.
        reset = dev.energy_reset_at
        if dev.energy_origin is not None:
            base, origin = float(dev.energy_base_mj), float(dev.energy_origin)
        elif reset is not None and (uid not in self._energy or self._energy[uid][2] < reset):
            if not math.isfinite(reset):
                raise ValueError("energy_reset_at must be finite")
            base, origin = float(dev.energy_base_mj), float(reset)
        elif uid in self._energy:
            pbase, ppower, porigin = self._energy[uid]
            if ppower == dev.power_w:
                base, origin = pbase, porigin
            else:
                base, origin = pbase + ppower * 1000.0 * max(0.0, now - porigin), now
        else:
            base, origin = float(dev.energy_base_mj), now
        self._energy[uid] = (base, float(dev.power_w), origin)
        out += [
            f"energy {base!r} {origin!r}",
            f"temperature {int(dev.temperature_c)}",
            f"ecc {int(dev.ecc_corrected)} {int(dev.ecc_uncorrected)}",
            f"lost {int(dev.lost)}",
            f"mig_on {int(dev.mig_on)}",
        ]
        hist = self._history(self._util.setdefault(uid, []), dev.util, 0.0, now, horizon)
        out += [_trace("util", start, pat, "derived") for start, pat in hist]

        pids: set[int] = set()
        for proc in dev.processes:
            if proc.pid in pids or not 0 < proc.pid < 2**32:
                raise ValueError(f"bad or duplicate pid {proc.pid} on device {dev.index}")
            pids.add(proc.pid)
            if proc.kind not in ("compute", "graphics", "mps", "compute+graphics"):
                raise ValueError(f"bad process kind {proc.kind!r}")
            out.append(
                f"process {proc.pid} {proc.kind} {int(proc.used_memory)} "
                f"{_id(proc.gpu_instance_id)} {_id(proc.compute_instance_id)}"
            )
            start = now if proc.start_time is None else float(proc.start_time)
            phist = self._history(
                self._psm.setdefault((uid, proc.pid), []), proc.sm, start, now, horizon
            )
            out += [_trace("psm", s, pat, "none") for s, pat in phist]
            if proc.sm_scale != 1.0:
                if not 0 < proc.sm_scale <= 10:
                    raise ValueError(f"sm_scale of pid {proc.pid} must be within (0, 10]")
                out.append(f"psm_scale {float(proc.sm_scale)!r}")
            if proc.garbage_every:
                out.append(f"pgarbage {int(proc.garbage_every)}")

        if len(dev.mig) > 8:
            raise ValueError("at most 8 MIG instances per device")
        for m in dev.mig:
            muuid = m.uuid or (
                f"MIG-{dev.index:08x}-{m.gpu_instance_id:04x}-"
                f"{m.compute_instance_id:04x}-8000-{dev.index:012x}"
            )
            out.append(
                f"mig {int(m.gpu_instance_id)} {int(m.compute_instance_id)} "
                f"{int(m.memory_total)} {int(m.memory_used)} {_word(muuid, 'MIG uuid')} "
                f"{_text(m.name, 'MIG name')}"
            )
        last_seq: int | None = None
        for ev in sorted(dev.xid_events, key=lambda e: e.seq):
            if last_seq is not None and ev.seq <= last_seq:
                raise ValueError(f"duplicate Xid seq {ev.seq} on device {dev.index}")
            last_seq = ev.seq
            when = ev.time
            if when is None:
                when = self._xid_time.setdefault((uid, ev.seq), now)
            out.append(
                f"xid {int(ev.seq)} {int(ev.xid)} {float(when)!r} "
                f"{_id(ev.gpu_instance_id)} {_id(ev.compute_instance_id)}"
            )
        out += self._render_gpm(dev, now, horizon)
        out += self._render_health(dev, now)
        out += _injections(dev.errors, dev.sleeps, dev.errors_once)
        out.append("end")
        return out

    def _render_health(self, dev: Device, now: float) -> list[str]:
        """Violation counters (continued across writes), SM clocks, error counters."""
        out = []
        for reason, fraction in (dev.throttle or {}).items():
            if reason not in THROTTLE_POLICIES or not 0 <= fraction <= 1:
                raise ValueError(f"throttle {reason!r}: want a reason of {THROTTLE_POLICIES} "
                                 "and a share of the time within 0..1")
            key = (dev.uuid, reason)
            if key not in self._violation:
                base, origin = float(dev.violation_base_ns), now
            else:
                pbase, porigin, pfrac = self._violation[key]
                base, origin = pbase, porigin
                if pfrac != fraction:
                    base, origin = pbase + duty_active_s(now - porigin, pfrac) * 1e9, now
            self._violation[key] = (base, origin, float(fraction))
            out.append(f"violation {THROTTLE_POLICIES[reason]} {base!r} {origin!r} "
                       f"{float(fraction)!r}")
        if dev.sm_clock_mhz is not None:
            out.append(f"sm_clock {int(dev.sm_clock_mhz)} {int(dev.sm_clock_max_mhz)}")
        if dev.remapped_rows is not None:
            out.append("remapped_rows " + " ".join(str(int(n)) for n in dev.remapped_rows))
        if dev.pcie_replays is not None:
            out.append(f"pcie_replays {int(dev.pcie_replays)}")
        for link, counts in sorted((dev.nvlink_errors or {}).items()):
            out.append(f"nvlink {int(link)} " + " ".join(str(int(n)) for n in counts))
        return out

    def _render_gpm(self, dev: Device, now: float, horizon: float) -> list[str]:
        """``gpm_support`` and the GPM trace histories of the GPU and its MIG instances."""
        out = [f"gpm_support {int(dev.gpm is not None)}"]
        targets = [("-", dev.gpm or {})]
        targets += [(str(int(m.gpu_instance_id)), m.gpm) for m in dev.mig]
        for gi, traces in targets:
            for name, trace in traces.items():
                if name not in GPM_METRICS:
                    raise ValueError(f"unknown GPM metric {name!r} (known: {sorted(GPM_METRICS)})")
                if gi != "-" and name in _GPM_TRAFFIC:
                    raise ValueError(f"GPM metric {name!r} is for whole GPUs only")
                key = (dev.uuid, gi, name)
                self._live_gpm.add(key)
                hist = self._history(self._gpm.setdefault(key, []), _gpm_pattern(name, trace),
                                     0.0, now, horizon)
                prefix = f"gpm {gi} {GPM_METRICS[name]}"
                out += [_trace(prefix, s, pat, "none") for s, pat in hist]
        return out


def fake_nvml_or_skip(workdir: Path) -> FakeNvml:
    """A built :class:`FakeNvml`, or skip the test (fail under ``CI=true``)."""
    from tests.support import require  # only tests call this

    fake = FakeNvml(workdir)
    try:
        fake.build()
    except FakeNvmlUnavailable as exc:
        require(False, f"fake NVML unavailable: {exc}")
    return fake
