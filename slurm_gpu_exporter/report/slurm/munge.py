"""A munge credential of whoever runs the report (``munge -n``), for a proxy that takes
``Authorization: Munge <credential>``. One credential per request: munged refuses a
credential it has decoded before."""

from __future__ import annotations

import shutil
import subprocess

from slurm_gpu_exporter.report.errors import ReportError

MUNGE_TIMEOUT_S = 5.0
EXIT_NO_CREDENTIAL = 3


def munge_credential(socket: str | None = None, munge: str | None = None) -> str:
    """A fresh credential of the calling user, from the local munged."""
    found = munge or shutil.which("munge") or "/usr/bin/munge"
    argv = [found, "-n"] + ([f"--socket={socket}"] if socket else [])
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=MUNGE_TIMEOUT_S, check=False, errors="replace")
    except FileNotFoundError:
        raise ReportError("--auth munge needs the munge command (Debian: apt-get install "
                          "munge)", EXIT_NO_CREDENTIAL) from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReportError(f"munge did not make a credential ({exc}); is munged running?",
                          EXIT_NO_CREDENTIAL) from None
    credential = proc.stdout.strip()
    if proc.returncode != 0 or not credential.startswith("MUNGE:"):
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise ReportError(f"munge did not make a credential: {last}; is munged running?",
                          EXIT_NO_CREDENTIAL)
    return credential

