"""What a munge credential for slurm-gpu-proxy carries: ``slurm-gpu-proxy <URL>``, the
proxy's base URL as the client reaches it, so that the proxy can tell a credential made
for it from one made for another service (a plain ``munge -n`` names none). The one
format of both products: slurm-gpu-report makes it (report/cli/flags.py), the proxy
checks it (proxy/munge.py). Standard library only: the proxy loads no report code."""

from __future__ import annotations

from urllib.parse import urlsplit

PREFIX = "slurm-gpu-proxy "
_DEFAULT_PORTS = {"http": 80, "https": 443}


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
