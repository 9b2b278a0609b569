"""The web config in force, re-read without a restart.

The agent checks ``--web.config.file`` (and the certificate, key and CA files it
names) every few seconds, and at once on SIGHUP. A change is compared by inode,
size and modification time, so an editor's rename-into-place and a cert-manager
rotation are both seen. A new file that fails to load leaves the last good config
in force and says so in one log line, once per bad version of the file.

New TLS settings apply to new connections: the listening socket holds a context
whose ``wrap_bio`` hands each new connection to the context of the config now in
force. Turning TLS on or off changes the listening socket itself and so needs a
restart; such a file is refused like a broken one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import stat
import threading
from pathlib import Path
from typing import Any

from slurm_gpu_exporter.web.config import WebConfig, WebConfigError, load_web_config

log = logging.getLogger(__name__)

DEFAULT_RELOAD_INTERVAL = 5.0

Fingerprint = tuple[tuple[int, int, int] | None, ...]


def warn_if_loose(path: Path) -> bool:
    """Warn when the web config file (or its directory) can be written by group or
    others: any such user could turn TLS or basic auth off. True when it warned."""
    for current in (path, path.parent):
        try:
            mode = os.stat(current).st_mode
        except OSError:
            return False
        if mode & (stat.S_IWGRP | stat.S_IWOTH) and not (
                current != path and mode & stat.S_ISVTX):
            log.warning("web config %s: %s is writable by group or others (mode %04o), so "
                        "any such user could turn TLS or basic auth off; fix: chmod go-w %s",
                        path, current, stat.S_IMODE(mode), current)
            return True
    return False


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class LiveWebConfig:
    """Holds the web config in force and its TLS context; ``check`` re-reads on change."""

    def __init__(self, path: Path | None, config: WebConfig | None = None) -> None:
        self.path = path
        first = _stat(path) if path is not None else None
        self.current = config if config is not None else (
            load_web_config(path) if path is not None else WebConfig())
        self._ssl = self.current.ssl_context()
        self._seen = self._fingerprint(self.current)
        if self._seen and self._seen[0] != first:
            self._seen = ()  # changed while it was read: read again at the first check
        if path is not None and config is None:
            warn_if_loose(path)
            if not self.current.users and self.current.tls is None:
                log.warning("web config %s sets neither TLS nor basic auth: /metrics is "
                            "served to anyone who can reach it; add basic_auth_users or "
                            "tls_server_config if that is not meant", path)
        self._lock = threading.Lock()
        self.reloads = 0
        self.failures = 0

    def _fingerprint(self, config: WebConfig) -> Fingerprint:
        if self.path is None:
            return ()
        files = [self.path]
        if config.tls is not None:
            files += [config.tls.cert_file, config.tls.key_file]
            if config.tls.client_ca_file is not None:
                files.append(config.tls.client_ca_file)
        return tuple(_stat(f) for f in files)

    def check(self) -> bool:
        """Re-read the files if any changed; True when a new config took effect."""
        if self.path is None:
            return False
        with self._lock:
            # Taken before reading: an edit made while the file is read is seen as a
            # change at the next check, not taken for the version just read.
            before = self._fingerprint(self.current)
            if before == self._seen:
                return False
            # Remember this version whatever happens, so a broken file is reported
            # once, not every few seconds.
            self._seen = before
            warn_if_loose(self.path)
            try:
                config = load_web_config(self.path)
                if (config.tls is None) != (self.current.tls is None):
                    raise WebConfigError("turning TLS on or off needs a restart")
                context = config.ssl_context()
            except WebConfigError as exc:
                self.failures += 1
                log.warning("web config %s not re-read, the last good one stays in force: %s",
                            self.path, exc)
                return False
            if self.current.users and not config.users:
                log.warning("web config %s re-read without basic_auth_users: /metrics is now "
                            "served without a password; restore the users if that is not "
                            "meant", self.path)
            after = self._fingerprint(config)
            # The same files changed while being read: read them again next time.
            self._seen = after if len(after) != len(before) or after[0] == before[0] else ()
            self.current, self._ssl = config, context
            self.reloads += 1
            log.info("web config %s re-read; new connections use it", self.path)
            return True

    def current_ssl_context(self) -> ssl.SSLContext | None:
        return self._ssl

    def server_ssl_context(self) -> ssl.SSLContext | None:
        """The context to listen with: None for plain HTTP, else one that follows re-reads."""
        if self._ssl is None:
            return None
        return _FollowingContext.following(self)


class _FollowingContext(ssl.SSLContext):
    """A server context that wraps each new connection with the context now in force."""

    _live: LiveWebConfig

    @classmethod
    def following(cls, live: LiveWebConfig) -> _FollowingContext:
        ctx = cls(ssl.PROTOCOL_TLS_SERVER)
        ctx._live = live
        return ctx

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:  # type: ignore[override]
        current = self._live.current_ssl_context()
        assert current is not None  # TLS cannot be turned off by a re-read
        return current.wrap_bio(*args, **kwargs)


async def watch_web_config(web_config: LiveWebConfig, interval: float,
                           wake: asyncio.Event) -> None:
    """Re-read the web config every ``interval`` seconds, or at once when woken (SIGHUP).
    Without a web config file there is nothing to re-read: only SIGHUP wakes it."""
    loop = asyncio.get_running_loop()
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), interval if web_config.path else None)
        wake.clear()
        # Off the event loop: loading certificates reads files.
        await loop.run_in_executor(None, web_config.check)
