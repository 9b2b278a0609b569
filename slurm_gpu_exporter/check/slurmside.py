"""Slurm's version, the agent's look-up path, and where slurm.conf is read from."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from slurm_gpu_exporter.check.findings import Finding
from slurm_gpu_exporter.node.slurm.lookup import CLI_TIMEOUT_S, local_slurm_version, pyslurm_matches


@dataclass(frozen=True)
class SlurmAccess:
    """How the check reaches Slurm; tests give their own."""

    version: Callable[[], str | None]
    show_config: Callable[[], str]  # raises RuntimeError with a one-line reason
    import_pyslurm: Callable[[], ModuleType]


def _show_config() -> str:
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        raise RuntimeError("scontrol is not on PATH")
    try:
        proc = subprocess.run([scontrol, "show", "config"], capture_output=True, text=True,
                              timeout=CLI_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"scontrol show config took over {CLI_TIMEOUT_S:g} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise RuntimeError(f"scontrol show config failed: {last}")
    return proc.stdout


def _import_pyslurm() -> ModuleType:
    import pyslurm  # optional, as in the agent

    return pyslurm


LOCAL = SlurmAccess(local_slurm_version, _show_config, _import_pyslurm)


def check_lookup(access: SlurmAccess, mode: str) -> list[Finding]:
    """Slurm's version and the look-up path ``--slurm-lookup mode`` takes, as the agent
    chooses it (slurm.make_lookup)."""
    version = access.version()
    if version is None:
        return [Finding("warn", "slurm", "scontrol --version gives no Slurm version, so jobs "
                                         "found only in cgroups lack account and partition; "
                                         "install the Slurm client commands on the node")]
    findings = [Finding("ok", "slurm", version)]
    if mode == "off":
        findings.append(Finding("note", "slurm", "look-ups are off (--slurm-lookup off): jobs "
                                                 "without a spool record lack metadata"))
        return findings
    how = "the Slurm CLI (squeue/scontrol)"
    if mode == "auto":
        try:
            pyslurm = access.import_pyslurm()
        except Exception as exc:  # ImportError, or a libslurm it was not built against
            how += f"; pyslurm is not importable ({type(exc).__name__})"
        else:
            pv = str(getattr(pyslurm, "__version__", ""))
            if pyslurm_matches(pv, version):
                how = f"pyslurm {pv}"
            else:
                how += f"; pyslurm {pv or '(unknown version)'} does not match {version}"
    findings.append(Finding("ok", "slurm", f"look-ups through {how}"))
    return findings


def read_config(access: SlurmAccess, slurm_conf: Path | None) -> tuple[str | None, Finding]:
    """slurm.conf's text (from ``--slurm-conf`` or ``scontrol show config``), or None
    with the reason as a finding."""
    if slurm_conf is not None:
        try:
            return slurm_conf.read_text(errors="replace"), Finding(
                "ok", "slurm.conf", f"read from {slurm_conf}")
        except OSError as exc:
            return None, Finding("block", "slurm.conf", f"cannot read {slurm_conf}: "
                                                        f"{exc.strerror}; pass a readable "
                                                        f"--slurm-conf")
    try:
        return access.show_config(), Finding("ok", "slurm.conf", "read from scontrol show config")
    except RuntimeError as exc:
        return None, Finding("warn", "slurm.conf", f"not checked: {exc}; pass --slurm-conf "
                                                   f"/etc/slurm/slurm.conf")
