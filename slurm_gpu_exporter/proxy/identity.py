"""Who is asking: a basic-auth user of the web config, a user named in a header by
a client that proved itself (Grafana's ``send_user_header``), or the owner of a munge
credential (munge.py)."""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from slurm_gpu_exporter.model.munge_wire import credential_in
from slurm_gpu_exporter.model.users import is_user_name
from slurm_gpu_exporter.proxy.config import UserHeader
from slurm_gpu_exporter.proxy.munge import MungeDecoder, MungeRefusal
from slurm_gpu_exporter.web.basic_auth import AuthBusy, BasicAuth
from slurm_gpu_exporter.web.config import WebConfig


@dataclass(frozen=True)
class Caller:
    name: str
    via: str  # "basic", "header" or "munge"


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str
    message: str
    claimed: str = ""  # the name the request claimed, for the log line


def _peer_sans(request: web.Request) -> set[str]:
    transport = request.transport
    cert: dict[str, Any] | None = transport.get_extra_info("peercert") if transport else None
    return {value for _, value in (cert or {}).get("subjectAltName", ())}


def _proven(request: web.Request, header: UserHeader) -> bool:
    """True when the client showed the shared secret or a certificate with an allowed SAN."""
    if header.secret is not None and header.secret_header is not None:
        given = request.headers.getall(header.secret_header, [])
        if len(given) == 1 and hmac.compare_digest(given[0].encode(), header.secret):
            return True
    sans = _peer_sans(request)
    return any(hmac.compare_digest(a, b) for a in header.client_cert_sans for b in sans)


def basic_auth_user(authorization: str) -> str:
    """The user name of a ``Basic`` Authorization header the web config has verified."""
    decoded = base64.b64decode(authorization[6:], validate=True).decode()
    return decoded.partition(":")[0]


async def identify(request: web.Request, web_config: WebConfig,
                   user_header: UserHeader | None,
                   munge: MungeDecoder | None = None, *, auth: BasicAuth) -> Caller | Refusal:
    """The caller, or why the request is refused (401; 403 for a disallowed certificate;
    503 when too many password checks wait); ``auth`` checks basic-auth passwords
    against ``web_config``."""
    transport = request.transport
    if not web_config.client_cert_allowed(
            transport.get_extra_info("peercert") if transport else None):
        return Refusal(403, "client_cert", "client certificate not allowed; use one with an "
                       "allowed subjectAltName")
    if user_header is not None and user_header.name in request.headers:
        values = request.headers.getall(user_header.name)
        claimed = values[0] if len(values) == 1 else ""
        if not _proven(request, user_header):
            return Refusal(401, "forged_user_header", f"{user_header.name} is accepted only "
                           "from a client that proves itself (shared secret or client "
                           "certificate)", claimed)
        if len(values) != 1 or not is_user_name(claimed):
            return Refusal(401, "bad_user_header", f"{user_header.name} must hold one user "
                           "name (letters, digits, ._@+-)", claimed)
        return Caller(claimed, "header")
    authorization = request.headers.get("Authorization")
    credential = credential_in(authorization) if authorization else None
    if credential is not None:
        return await _munge_caller(credential, munge)
    if not web_config.users or not authorization:
        ways = ["basic auth with a user of the web config"] if web_config.users else []
        if munge is not None:
            ways.append("'Authorization: Munge <credential>' made for this proxy "
                        "(slurm-gpu-report --auth munge)")
        how = " or ".join(ways) or "the user header from a client that proves itself"
        return Refusal(401, "unauthenticated", f"authentication required: {how}")
    try:
        name = basic_auth_user(authorization) if authorization.startswith("Basic ") else ""
    except (binascii.Error, UnicodeDecodeError):
        name = ""
    try:
        verified = await auth.check_async(web_config, authorization)
    except AuthBusy as exc:  # a wrong-password flood: a retry soon gets its turn
        return Refusal(503, "auth_busy", f"too many password checks at once ({exc}); "
                       "retry in a second", name)
    if not verified:
        return Refusal(401, "bad_credentials", "wrong user name or password", name)
    if not is_user_name(name):
        return Refusal(401, "bad_credentials", "basic-auth user names must be letters, "
                       "digits and ._@+-", name)
    return Caller(name, "basic")


async def _munge_caller(credential: str, munge: MungeDecoder | None) -> Caller | Refusal:
    if munge is None:
        return Refusal(401, "munge_off", "this proxy does not take munge credentials "
                       "(start it with --munge); use basic auth")
    who = await munge.decode(credential)
    if isinstance(who, MungeRefusal):
        return Refusal(who.status, who.reason, who.message)
    if not is_user_name(who.name):
        return Refusal(401, "bad_credentials", "user names must be letters, digits and "
                       "._@+-", who.name)
    return Caller(who.name, "munge")
