"""munge for the tests: credentials made as a user with the real ``munge``, and a
munged of the test's own (its own key and socket), ended by its PID."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.support import require, wait_until

SITE_SOCKET = Path("/run/munge/munge.socket.2")


def credential(user: str = "root", socket: Path = SITE_SOCKET, ttl: int | None = None,
               payload: str | None = None, restrict_uid: int | None = None) -> str:
    """A fresh credential of ``user`` (``runuser -u USER -- munge``), with ``payload``
    (none: ``munge -n``, as a service that asks for no payload takes them), decodable
    only by ``restrict_uid`` when given."""
    argv = ["munge", f"--socket={socket}"] + ([f"--ttl={ttl}"] if ttl else [])
    argv += ["-n"] if payload is None else []
    argv += [f"--restrict-uid={restrict_uid}"] if restrict_uid is not None else []
    if user != "root":
        argv = [shutil.which("runuser") or "/usr/sbin/runuser", "-u", user, "--", *argv]
    proc = subprocess.run(argv, input=payload or "", capture_output=True, text=True,
                          timeout=10, check=False)
    assert proc.returncode == 0, f"munge as {user} failed: {proc.stderr.strip()}"
    return proc.stdout.strip()


def for_proxy(user: str, proxy_url: str, **options: Any) -> str:
    """A credential of ``user`` made for the proxy at ``proxy_url``, with the payload the
    proxy asks for, written out here (not the client's code)."""
    return credential(user, payload=f"slurm-gpu-proxy {proxy_url}", **options)


def site_munge_works() -> bool:
    try:
        proc = subprocess.run(["unmunge", f"--socket={SITE_SOCKET}"],
                              input=credential(), capture_output=True, text=True, timeout=10)
    except AssertionError:
        return False
    return proc.returncode == 0


class OwnMunged:
    """A second munged with a key of its own: its credentials are another site's."""

    def __init__(self) -> None:
        require(shutil.which("munged") is not None, "munged (Debian package munge) is "
                "not installed")
        # munged wants every directory above its socket searchable by all: pytest's
        # temporary directories are not.
        base = self.base = Path(tempfile.mkdtemp(prefix="sge-munged-", dir="/tmp"))
        base.chmod(0o755)
        private = base / "private"
        private.mkdir(mode=0o700, exist_ok=True)
        key = private / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.socket = base / "munge.socket"
        self.log_path = private / "munged.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            ["munged", "--foreground", f"--socket={self.socket}", f"--key-file={key}",
             f"--pid-file={private / 'munged.pid'}", f"--seed-file={private / 'seed'}",
             f"--log-file={self.log_path}"],
            stdout=self._log, stderr=subprocess.STDOUT)
        wait_until(lambda: self.socket.exists() or self.proc.poll() is not None, 10,
                   "the test's munged to make its socket",
                   log=lambda: self.log_path.read_text(errors="replace"))
        assert self.proc.poll() is None, self.log_path.read_text(errors="replace")
        wait_until(self.socket.exists, 1, "the test's munged to make its socket",
                   log=lambda: self.log_path.read_text(errors="replace"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        shutil.rmtree(self.base, ignore_errors=True)
