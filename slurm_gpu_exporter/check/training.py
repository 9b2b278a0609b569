"""Whether training scripts in jobs can reach the agent's relay socket."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path

from slurm_gpu_exporter.check.findings import Finding
from slurm_gpu_exporter.training_relay.socketfile import MAX_SOCKET_PATH, SOCKET_NAME


def _blocked_dir(path: Path) -> Path | None:
    """The first directory on the way to ``path`` that other users cannot pass."""
    for directory in [*reversed(path.parents), path]:
        try:
            mode = os.stat(directory).st_mode
        except OSError:
            return None  # not there yet: the agent makes the spool dir with mode 0755
        if not mode & stat.S_IXOTH:
            return directory
    return None


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock, \
            contextlib.suppress(OSError):
        sock.settimeout(1)
        sock.connect(str(path))
        return True
    return False


def check_training(spool_dir: Path, enabled: bool) -> list[Finding]:
    """The relay's socket in the spool dir: its path, who can reach it, who serves it."""
    if not enabled:
        return [Finding("note", "training", "the training relay is off (--no-training.relay): "
                                            "no slurm_job_training_* series from job scripts")]
    path = spool_dir / SOCKET_NAME
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        return [Finding("warn", "training",
                        f"{path} is longer than a unix socket path may be ({MAX_SOCKET_PATH} "
                        f"bytes): the agent runs without the relay; use a shorter --spool-dir")]
    blocked = _blocked_dir(spool_dir)
    if blocked is not None:
        return [Finding("warn", "training",
                        f"{blocked} is not searchable by other users, so training scripts in "
                        f"jobs cannot reach {path}; chmod o+x {blocked}")]
    if not path.is_socket():
        return [Finding("note", "training", f"no socket at {path} yet: the agent makes it "
                                            f"when it starts")]
    if not _listening(path):
        return [Finding("warn", "training", f"nothing listens on {path}: is the agent running? "
                                            f"(it replaces the socket when it starts)")]
    return [Finding("ok", "training", f"the agent serves {path}; job scripts can reach it")]
