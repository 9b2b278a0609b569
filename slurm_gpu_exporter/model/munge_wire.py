"""The munge wire format between slurm-gpu-report and slurm-gpu-proxy: the
``Authorization: Munge <credential>`` header, what a credential looks like as ``munge``
prints it, and what its payload names: ``slurm-gpu-proxy <URL>``, the proxy's base URL
as the client reaches it, so that the proxy can tell a credential made for it from one
made for another service (a plain ``munge -n`` names none).

Both products use this one module: slurm-gpu-report makes the header and the payload
(report/prometheus/client.py, report/cli/flags.py), the proxy reads them
(proxy/identity.py, proxy/munge.py). Standard library only, no I/O: the proxy loads
no report code.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

__all__ = ["CREDENTIAL", "MAX_CREDENTIAL_CHARS", "PREFIX", "SCHEME", "audience",
           "authorization", "credential_in", "is_credential", "payload"]

SCHEME = "Munge "  # the Authorization header's scheme, its space included
PREFIX = "slurm-gpu-proxy "  # a payload's start; the proxy's URL follows
# What munge prints: "MUNGE:" base64 ":" (a credential without payload is ~130
# characters; the cap leaves room for a small payload and refuses the rest unread).
CREDENTIAL = re.compile(r"MUNGE:[A-Za-z0-9+/]+={0,2}:")
MAX_CREDENTIAL_CHARS = 4096
_DEFAULT_PORTS = {"http": 80, "https": 443}


def authorization(credential: str) -> str:
    """The Authorization header's value that carries ``credential``."""
    return SCHEME + credential


def credential_in(header: str) -> str | None:
    """The credential an Authorization header's value carries (surrounding blanks
    dropped, not yet checked), or None when it is not of the ``Munge`` scheme."""
    return header[len(SCHEME):].strip() if header.startswith(SCHEME) else None


def is_credential(text: str) -> bool:
    """True when ``text`` is one credential as munge prints it, within the size cap."""
    return len(text) <= MAX_CREDENTIAL_CHARS and CREDENTIAL.fullmatch(text) is not None


def audience(url: str) -> str:
    """The canonical form of a proxy URL: ``scheme://host[:port][/path]``, scheme and host
    in lower case, a default port and a trailing ``/`` left out, nothing else kept.
    Raises ValueError for anything but an http(s) URL with a host."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = parts.hostname  # lower case, without brackets
    if scheme not in _DEFAULT_PORTS or not host:
        raise ValueError(f"{url!r} is not an http:// or https:// URL with a host")
    port = parts.port  # raises ValueError for a port that is not one
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port in (None, _DEFAULT_PORTS[scheme]) else f"{host}:{port}"
    return f"{scheme}://{netloc}{parts.path.rstrip('/')}"


def payload(url: str) -> str:
    """The payload of a credential for the proxy at ``url``."""
    return PREFIX + audience(url)
