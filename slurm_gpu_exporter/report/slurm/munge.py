"""A munge credential of whoever runs the report, for a proxy that takes
``Authorization: Munge <credential>``. Its payload names the proxy it is for
(model/munge_wire.py, made by the caller), so the proxy refuses a
credential made for another service, and no other proxy takes this one. One credential
per request: munged refuses a credential it has decoded before."""

from __future__ import annotations

import shutil
import subprocess

from slurm_gpu_exporter.report.errors import ReportError

MUNGE_TIMEOUT_S = 5.0
EXIT_NO_CREDENTIAL = 3


def munge_credential(payload: str, socket: str | None = None,
                     munge: str | None = None, restrict_uid: int | None = None) -> str:
    """A fresh credential of the calling user with ``payload`` (what names the proxy it
    is for), from the local munged; with ``restrict_uid`` (the proxy's uid) no process
    of another uid can decode it."""
    found = munge or shutil.which("munge") or "/usr/bin/munge"
    argv = [found] + ([f"--socket={socket}"] if socket else [])  # payload on stdin
    argv += [f"--restrict-uid={restrict_uid}"] if restrict_uid is not None else []
    try:
        proc = subprocess.run(argv, input=payload, capture_output=True, text=True,
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

