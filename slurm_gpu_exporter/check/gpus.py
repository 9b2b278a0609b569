"""The GPUs as the agent's NVML backend sees them: index, minor number, UUID, MIG, GPM."""

from __future__ import annotations

import os
from pathlib import Path

from slurm_gpu_exporter.check.findings import Finding
from slurm_gpu_exporter.gpu.backend import GpuBackend, GpuUnavailable
from slurm_gpu_exporter.gpu.readings import DeviceReading


def profiling_admin_only(proc_root: Path) -> bool | None:
    """The driver's ``RmProfilingAdminOnly`` (None: no NVIDIA driver params to read)."""
    try:
        text = (proc_root / "driver" / "nvidia" / "params").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "RmProfilingAdminOnly":
            return value.strip() == "1"
    return None


def _device(d: DeviceReading) -> Finding:
    if d.lost:
        return Finding("block", "gpu", f"GPU {d.index} is lost (NVML cannot read it), so its "
                                       f"jobs have no GPU figures; check nvidia-smi and the "
                                       f"kernel log, then reset or drain the node")
    mig = f", MIG: {len(d.mig)} instance(s)" if d.mig else ""
    gpm = "GPM" if d.gpm_supported else "no GPM"
    facts = f"GPU {d.index}: {d.name}, UUID {d.uuid}, minor {d.minor}{mig}, {gpm}"
    if d.minor is None:
        return Finding("warn", "gpu", f"{facts}: the minor number is unreadable, so Slurm's "
                                      f"GPU indices cannot be matched to it; jobs are tied to "
                                      f"it only through UUIDs and processes")
    if d.minor != d.index:
        return Finding("note", "gpu", f"{facts}: NVML index {d.index} is /dev/nvidia{d.minor}, "
                                      f"Slurm's GPU {d.minor}; the agent maps Slurm's indices "
                                      f"by minor number")
    return Finding("ok", "gpu", facts)


def check_gpus(backend: GpuBackend, proc_root: Path) -> list[Finding]:
    """One finding per GPU, with NVML's own failure as a warning (no GPU figures)."""
    try:
        driver = backend.init()
    except GpuUnavailable as exc:
        return [Finding("warn", "gpu", f"{exc}: no GPU figures; install the NVIDIA driver "
                                       f"(libnvidia-ml.so.1) on GPU nodes, else ignore this")]
    try:
        readings = backend.read({})
    finally:
        backend.shutdown()
    findings = [Finding("ok", "gpu", f"NVIDIA driver {driver}, {len(readings)} GPU(s)")]
    findings.extend(_device(d) for d in readings)
    admin_only = profiling_admin_only(proc_root)
    if admin_only and any(d.gpm_supported for d in readings) and os.geteuid() != 0:
        findings.append(Finding("warn", "gpu", "GPU profiling is restricted to admins "
                                               "(RmProfilingAdminOnly=1) and the agent is not "
                                               "root, so GPM figures are missing; run it as "
                                               "root"))
    elif admin_only is not None:
        who = "admins" if admin_only else "every user"
        findings.append(Finding("note", "gpu", f"GPU profiling is open to {who} "
                                               f"(RmProfilingAdminOnly={int(admin_only)})"))
    return findings
