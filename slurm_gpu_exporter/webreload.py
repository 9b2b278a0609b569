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

import logging
import os
import ssl
import threading
from pathlib import Path
from typing import Any

from slurm_gpu_exporter.webconfig import WebConfig, WebConfigError, load_web_config

log = logging.getLogger(__name__)

DEFAULT_RELOAD_INTERVAL = 5.0

Fingerprint = tuple[tuple[int, int, int] | None, ...]


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
        self.current = config if config is not None else (
            load_web_config(path) if path is not None else WebConfig())
        self._ssl = self.current.ssl_context()
        self._seen = self._fingerprint(self.current)
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
            if self._fingerprint(self.current) == self._seen:
                return False
            # Remember this version whatever happens, so a broken file is reported
            # once, not every few seconds.
            self._seen = self._fingerprint(self.current)
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
            config.adopt_verified(self.current)  # no new bcrypt check for known scrapers
            self.current, self._ssl = config, context
            self._seen = self._fingerprint(config)
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
