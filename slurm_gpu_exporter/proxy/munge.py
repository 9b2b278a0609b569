"""Who is asking, from a munge credential (``Authorization: Munge <credential>``).

The credential is decoded by the site's munged, through Debian's ``unmunge``: munged
checks the MAC (the site's key), the TTL, its replay cache and any uid or gid the
credential is restricted to, and says whose it is. Its payload must name this proxy
(``slurm-gpu-proxy <URL>``, model/munge_wire.py): any service that takes munge
credentials sees them, and one made for another service must not sign in here.
Nothing the client says besides the credential counts; the uid munged answers is
mapped to a user name here, through the system's user database.
"""

from __future__ import annotations

import asyncio
import logging
import pwd
import re
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from slurm_gpu_exporter.model.munge_wire import PREFIX, is_credential

log = logging.getLogger(__name__)

DEFAULT_SOCKET = Path("/run/munge/munge.socket.2")
DECODE_TIMEOUT_S = 5.0
# Decodes at once; a request past them waits no longer than this, then gets 503.
MAX_CONCURRENT = 8
QUEUE_WAIT_S = 2.0
# unmunge's exit status is munge's error code (munge.h, munge_err_t).
REASONS = {
    6: ("munge_unavailable", "munged did not answer"),
    7: ("munge_unavailable", "munged did not answer in time"),
    15: ("munge_expired", "the munge credential has expired; make a fresh one"),
    16: ("munge_rewound", "the munge credential is from the future (clock skew)"),
    17: ("munge_replayed", "the munge credential was already used; make one per request"),
    18: ("munge_unauthorized", "the munge credential may be decoded by another uid or "
                               "group only; munge_restrict_uid in the client config must be "
                               "the proxy's uid"),
}


@dataclass(frozen=True)
class MungeUser:
    uid: int
    name: str


@dataclass(frozen=True)
class MungeRefusal:
    status: int  # 401, or 503 when munged cannot answer
    reason: str
    message: str


def _refusal(code: int) -> MungeRefusal:
    reason, message = REASONS.get(code, ("munge_invalid", "the munge credential is not "
                                         "valid here (forged, damaged or another site's key)"))
    return MungeRefusal(503 if reason == "munge_unavailable" else 401, reason, message)


def _uid(metadata: bytes) -> int | None:
    """The uid of ``unmunge -N -k UID`` output (``UID: 1001``)."""
    match = re.fullmatch(rb"UID:\s+(\d+)\s*", metadata)
    return int(match.group(1)) if match else None


_SHOWN_AUDIENCE = re.compile(r"https?://[A-Za-z0-9.:\[\]_~%/-]{1,200}")
# The clients that made plain `munge -n` credentials, for the one line that says what
# to do about it.
UPGRADE = ("a plain `munge -n` credential, as slurm-gpu-report made before its "
           "credentials named the proxy: upgrade slurm-gpu-report on this host")


def read_answer(returncode: int, out: bytes, audiences: Collection[str]
                ) -> int | MungeRefusal:
    """The uid of what ``unmunge --numeric --keys=UID`` answered (its exit status, then
    the metadata, a blank line and the payload), or why the credential is refused."""
    if returncode != 0:  # munged refused it: its metadata may still be printed
        return _refusal(returncode)
    metadata, blank, body = out.partition(b"\n\n")
    uid = _uid(metadata + b"\n") if blank else None
    if uid is None:
        log.warning("unmunge printed no uid: %r", out[:200])
        return _refusal(1)
    return audience_refusal(body, audiences) or uid


def audience_refusal(body: bytes, audiences: Collection[str]) -> MungeRefusal | None:
    """Why a credential's payload does not name this proxy (None when it does)."""
    if not body:
        return MungeRefusal(401, "munge_no_audience", "this proxy takes only munge "
                            f"credentials made for it, not {UPGRADE} (it then makes one "
                            f"with the payload '{PREFIX}<the proxy's URL>')")
    text = body.decode("ascii", errors="replace").removesuffix("\n")  # echo … | munge
    claimed = text[len(PREFIX):] if text.startswith(PREFIX) else ""
    if claimed in audiences:
        return None
    shown = repr(claimed) if _SHOWN_AUDIENCE.fullmatch(claimed) else "another service"
    return MungeRefusal(401, "munge_wrong_audience", f"this munge credential was made for "
                        f"{shown}, not this proxy ({', '.join(sorted(audiences)) or 'none'}):"
                        " give one of these as --prometheus-url, or ask the proxy's admins "
                        "to add yours with --munge.audience")


def _user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


class MungeDecoder:
    """Decodes credentials with ``unmunge --socket SOCKET``, a few at a time, each
    within a timeout."""

    def __init__(self, socket: Path = DEFAULT_SOCKET, unmunge: str | None = None,
                 timeout_s: float = DECODE_TIMEOUT_S,
                 max_concurrent: int = MAX_CONCURRENT,
                 audiences: Collection[str] = ()) -> None:
        found = unmunge or shutil.which("unmunge")
        if found is None:
            raise FileNotFoundError("unmunge not found; install munge (Debian: apt-get "
                                    "install munge)")
        self.socket, self.unmunge, self.timeout_s = socket, found, timeout_s
        # The canonical URLs (munge_wire.audience) a credential may name.
        self.audiences = frozenset(audiences)
        self._slots = asyncio.Semaphore(max_concurrent)

    async def decode(self, credential: str) -> MungeUser | MungeRefusal:
        """The user a credential belongs to, or why it is refused."""
        if not is_credential(credential):
            return MungeRefusal(401, "munge_malformed", "the Authorization header must be "
                                "'Munge ' and one credential as `munge` prints it")
        try:
            async with asyncio.timeout(QUEUE_WAIT_S):
                await self._slots.acquire()
        except TimeoutError:
            return MungeRefusal(503, "munge_busy", "too many munge credentials are being "
                                "checked at once; try again in a moment")
        try:
            return await self._decode(credential)
        finally:
            self._slots.release()

    async def _decode(self, credential: str) -> MungeUser | MungeRefusal:
        proc = await asyncio.create_subprocess_exec(
            self.unmunge, f"--socket={self.socket}", "--numeric", "--keys=UID",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            async with asyncio.timeout(self.timeout_s):
                out, err = await proc.communicate(credential.encode())
        except TimeoutError:
            proc.kill()
            await proc.wait()
            log.warning("unmunge did not answer within %g s (munged at %s)", self.timeout_s,
                        self.socket)
            return _refusal(7)
        code = -1 if proc.returncode is None else proc.returncode
        uid = read_answer(code, out, self.audiences)
        if isinstance(uid, MungeRefusal):
            if uid.status == 503:
                log.warning("unmunge failed: %s", err.decode(errors="replace").strip())
            return uid
        try:
            async with asyncio.timeout(self.timeout_s):  # NSS may ask a directory
                name = await asyncio.get_running_loop().run_in_executor(None, _user_name, uid)
        except TimeoutError:
            return MungeRefusal(503, "munge_unavailable", f"the user name of uid {uid} did "
                                "not come in time; try again")
        if name is None:
            return MungeRefusal(401, "munge_unknown_uid", f"uid {uid} has no user name on "
                                "the proxy's host; add it to its user database (NSS)")
        return MungeUser(uid, name)
