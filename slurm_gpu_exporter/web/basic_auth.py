"""A server's basic-auth checks against the web config in force (web/config.py), and
what they keep at run time: the credentials verified so far, the bcrypt threads, the
checks running and the count of those waiting.

The config is a frozen value that a re-read replaces whole; this state belongs to the
server's authentication (one per auth middleware, the proxy's in its state) and lives
as long as the server, so a re-read costs no scraper a new bcrypt check.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor

from slurm_gpu_exporter.web.config import WebConfig

# bcrypt reads 72 bytes of a password at most; a longer one is refused, as
# exporter-toolkit does, rather than checked by its first 72 bytes.
MAX_PASSWORD_BYTES = 72
# Password checks waiting or running at once; past that a request gets 503 at once.
MAX_PENDING_CHECKS = 16
# Two threads: bcrypt is CPU-bound, and a flood of wrong passwords must not take every
# core from the sampler.
BCRYPT_WORKERS = 2

Claim = tuple[bytes, bytes | None, bytes]  # password, bcrypt hash (None: no such user), key


class AuthBusy(Exception):
    """Too many password checks are waiting: the request should be retried shortly."""


def _claim(config: WebConfig, header: str | None) -> Claim | None:
    """(password, bcrypt hash, cache key) of a well-formed header; the hash is None
    for an unknown user (checked against a dummy hash, then refused)."""
    if not header or not header.startswith("Basic "):
        return None
    try:
        decoded = base64.b64decode(header[6:], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    if not sep:
        return None
    hashed = config.users.get(user)
    # The key holds the hash: a credential whose user or hash a re-read changed is
    # simply never found again.
    key = hashlib.sha256(user.encode() + b"\0" + password.encode() + b"\0"
                         + (hashed or b"")).digest()
    return password.encode(), hashed, key


class BasicAuth:
    """Checks the Authorization header of each request against a web config's users."""

    def __init__(self) -> None:
        # Successful (user, password) checks, keyed by a hash, so bcrypt runs once per
        # credential rather than once per scrape.
        self._verified: set[bytes] = set()
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._pending = 0
        # Checks running now, by cache key and event loop: the same credential sent on
        # many connections at once (a report's concurrent queries) is checked once.
        self._inflight: dict[tuple[int, bytes], asyncio.Future[bool]] = {}
        # By bcrypt cost: a hash that an unknown user's password is checked against, so
        # that the answer takes as long as for a known user with a wrong password.
        self._dummies: dict[int, bytes] = {}

    def check(self, config: WebConfig, header: str | None) -> bool:
        """True when basic auth is off, or the Authorization header names a valid user.

        Blocks for a bcrypt check on a credential not seen before; the servers use
        ``check_async``, which runs that check off the event loop."""
        claim = self._to_verify(config, header)
        return claim if isinstance(claim, bool) else self._verify(config, *claim)

    async def check_async(self, config: WebConfig, header: str | None) -> bool:
        """``check`` for the event loop: a credential already verified answers at once; a
        new one is checked by bcrypt in a worker thread, so a wrong password (which is
        never cached) cannot stall the scrapes of others. Raises AuthBusy when
        MAX_PENDING_CHECKS are already waiting or running."""
        claim = self._to_verify(config, header)
        if isinstance(claim, bool):
            return claim
        loop = asyncio.get_running_loop()
        flight = (id(loop), claim[2])
        running = self._inflight.get(flight)
        if running is not None:
            return await asyncio.shield(running)
        with self._lock:
            if self._pending >= MAX_PENDING_CHECKS:
                raise AuthBusy(f"{self._pending} password checks are waiting")
            self._pending += 1
        check = loop.run_in_executor(self._bcrypt_workers(), self._verify, config, *claim)
        self._inflight[flight] = check
        try:
            return await asyncio.shield(check)
        finally:
            if self._inflight.get(flight) is check:
                del self._inflight[flight]
            with self._lock:
                self._pending -= 1

    def _to_verify(self, config: WebConfig, header: str | None) -> bool | Claim:
        """The answer when no bcrypt check is needed (auth off, a malformed header or an
        unknown user, a credential verified before); else the claim to check."""
        if not config.users:
            return True
        claim = _claim(config, header)
        if claim is None:
            return False
        return True if self._known(claim[2]) else claim

    def _known(self, key: bytes) -> bool:
        with self._lock:
            return key in self._verified

    def _verify(self, config: WebConfig, password: bytes, hashed: bytes | None,
                key: bytes) -> bool:
        if len(password) > MAX_PASSWORD_BYTES:
            return False
        try:
            right = config.password_check(password, hashed or self._dummy_hash(config))
        except ValueError:  # bcrypt refusing its input is a wrong password, not a 500
            return False
        if not right or hashed is None:
            return False
        with self._lock:
            self._verified.add(key)
        return True

    def _dummy_hash(self, config: WebConfig) -> bytes:
        """A hash of the highest cost among the config's users."""
        cost = max(int(h[4:6]) for h in config.users.values())
        dummy = self._dummies.get(cost)
        if dummy is None:
            import bcrypt  # only a config with users needs it (memory: web/config._checkpw)

            dummy = bcrypt.hashpw(b"no such user", bcrypt.gensalt(rounds=cost))
            self._dummies[cost] = dummy
        return dummy

    def _bcrypt_workers(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=BCRYPT_WORKERS,
                                                    thread_name_prefix="basic-auth")
            return self._executor
