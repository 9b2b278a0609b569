"""A real PostgreSQL (Debian's) for the archive tests: its own data dir and port.

initdb and postgres run as the ``postgres`` user (PostgreSQL refuses root) in a
directory that user owns, on 127.0.0.1 and a free port; the server is ended by its own
PID.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from tests.support import free_port, require, wait_until


def _bindir() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    return str(Path(found[-1]).parent) if found else None


class PostgresServer:
    """``PostgresServer()`` starts it; ``url(db)`` names a database; ``stop()`` ends it."""

    def __init__(self) -> None:
        bindir = _bindir()
        require(bindir is not None, "PostgreSQL is not installed (Debian package postgresql)")
        require(os.geteuid() == 0, "starting PostgreSQL as the postgres user needs root")
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            require(False, "there is no postgres user (Debian package postgresql)")
            raise
        assert bindir is not None
        self.root = Path(tempfile.mkdtemp(prefix="sge-archive-pg-"))
        os.chown(self.root, user.pw_uid, user.pw_gid)
        self.port = free_port()
        self.log_path = self.root / "postgres.log"
        as_postgres = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": [],
                       "env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, "cwd": self.root}
        data = self.root / "data"
        subprocess.run([f"{bindir}/initdb", "-D", str(data), "-U", "postgres", "--auth=trust",
                        "-E", "UTF8", "--no-sync"], check=True, capture_output=True,
                       **as_postgres)  # type: ignore[call-overload]
        self._log = self.log_path.open("wb")
        os.chown(self.log_path, user.pw_uid, user.pw_gid)
        # fsync off: a test server; crash safety is what the store's transactions give.
        self.proc = subprocess.Popen(
            [f"{bindir}/postgres", "-D", str(data), "-p", str(self.port), "-k", str(self.root),
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
             "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
            stdout=self._log, stderr=subprocess.STDOUT, **as_postgres)  # type: ignore[call-overload]
        wait_until(self._ready, 30, "PostgreSQL to accept connections", log=self.log)

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"postgres exited with {self.proc.returncode}:\n{self.log()}")
        import psycopg

        try:
            with psycopg.connect(self.dsn("postgres"), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def dsn(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def create_database(self, name: str) -> str:
        """A new empty database; its URL."""
        import psycopg

        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown: no waiting for clients
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        shutil.rmtree(self.root, ignore_errors=True)
