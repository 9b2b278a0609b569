"""Shifted host clocks for one process: ``clock_shim.c`` built and preloaded.

A test makes a node booted a minute ago, a reboot, or a step of the wall clock without
privileges: the process it starts (an agent, a reader of the fake NVML) loads the shim
with ``LD_PRELOAD``, and everything in it that reads a clock through libc sees the shift.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from tests.fakenvml import FakeNvmlUnavailable, _cache_root, _find_compiler

SHIM_SOURCE = Path(__file__).with_name("clock_shim.c")
SHIM_NAME = "libclockshim.so"
_FLAGS = ("-O2", "-shared", "-fPIC", "-Wall", "-Werror")
_built: Path | None = None


def build_clock_shim() -> Path:
    """The shim library (built once per source version, into the fake NVML's cache)."""
    global _built
    if _built is not None and _built.is_file():
        return _built
    cc = _find_compiler()
    key = hashlib.sha256(SHIM_SOURCE.read_bytes() + " ".join((cc, *_FLAGS)).encode()
                         ).hexdigest()[:16]
    lib = _cache_root() / f"clockshim-{key}" / SHIM_NAME
    if not lib.is_file():
        lib.parent.mkdir(parents=True, exist_ok=True)
        tmp = lib.with_name(f".{SHIM_NAME}.{os.getpid()}.tmp")
        cmd = [cc, *_FLAGS, "-o", str(tmp), str(SHIM_SOURCE), "-ldl", "-lpthread"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        except OSError as exc:
            raise FakeNvmlUnavailable(f"cannot run the C compiler {cc!r}: {exc}") from exc
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"building the clock shim failed ({' '.join(cmd)}):\n{proc.stderr}")
        os.replace(tmp, lib)
    _built = lib
    return lib


def shifted_env(env: Mapping[str, str], *, realtime_s: float = 0.0,
                boottime_s: float = 0.0) -> dict[str, str]:
    """``env`` plus the shim preloaded with these offsets (seconds added to each clock).
    CLOCK_MONOTONIC is never shifted (clock_shim.c says why)."""
    out = dict(env)
    old = out.get("LD_PRELOAD")
    lib = str(build_clock_shim())
    out["LD_PRELOAD"] = f"{lib}:{old}" if old else lib
    out["CLOCK_SHIM_REALTIME"] = repr(float(realtime_s))
    out["CLOCK_SHIM_BOOTTIME"] = repr(float(boottime_s))
    return out


def booted_env(env: Mapping[str, str], up_s: float) -> dict[str, str]:
    """``env`` for a process on a node booted ``up_s`` seconds ago: its CLOCK_BOOTTIME
    reads ``up_s`` now (the offset from this process's clock, so it holds in a time
    namespace too), whatever this host's uptime. CLOCK_MONOTONIC stays the host's."""
    return shifted_env(env, boottime_s=up_s - time.clock_gettime(time.CLOCK_BOOTTIME))


def _own_offset(clock: str) -> int:
    """This process's time namespace offset of a clock (whole seconds; 0 where unknown)."""
    try:
        lines = Path("/proc/self/timens_offsets").read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        fields = line.split()
        if len(fields) == 3 and fields[0] == clock:
            return int(fields[1])
    return 0


def time_namespace_argv(up_s: int, asleep_s: int = 0) -> list[str]:
    """``unshare`` arguments that run a command in a new time namespace where
    CLOCK_BOOTTIME reads ``up_s`` seconds now and CLOCK_MONOTONIC ``up_s - asleep_s``
    (the kernel's own clocks, not a shim; needs root). The kernel takes offsets from the
    first namespace's clocks, so this namespace's own offsets are taken off."""
    args = ["unshare", "--time", "--fork"]
    for clock, clock_id, reads in (("boottime", time.CLOCK_BOOTTIME, up_s),
                                   ("monotonic", time.CLOCK_MONOTONIC, up_s - asleep_s)):
        host = time.clock_gettime(clock_id) - _own_offset(clock)
        args += [f"--{clock}", str(round(reads - host))]
    return [*args, "--"]


def time_namespace_problem() -> str | None:
    """Why a time namespace cannot be made here (None: it can): not root, no unshare,
    or a kernel or container that refuses one."""
    if os.geteuid() != 0:
        return "a time namespace needs root"
    try:
        run = subprocess.run([*time_namespace_argv(1000), "true"], capture_output=True,
                             text=True, timeout=30, check=False)
    except OSError as exc:
        return f"cannot run unshare (util-linux): {exc}"
    return None if run.returncode == 0 else f"unshare --time failed: {run.stderr.strip()}"
