"""The site's client config for users on login and GPU nodes: where the proxy is and
how to sign in to it, so that a user types only ``slurm-gpu-report job 12345``.

``/etc/slurm-gpu-report/client.toml`` (``$SLURM_GPU_REPORT_CLIENT`` overrides the
path); every key optional, the command line wins over it::

    prometheus_url = "https://metrics.example.org:9818"   # the slurm-gpu-proxy
    auth = "munge"                                        # or "none"
    ca_file = "/etc/ssl/certs/site-ca.pem"
    munge_socket = "/run/munge/munge.socket.2"
    munge_restrict_uid = 64123          # the proxy's uid: only it may decode them
    timeout_seconds = 30
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from slurm_gpu_exporter.report.errors import ReportError

DEFAULT_CLIENT_CONFIG = Path("/etc/slurm-gpu-report/client.toml")
CLIENT_ENV = "SLURM_GPU_REPORT_CLIENT"
AUTH_METHODS = ("none", "munge")
EXIT_BAD_CLIENT_CONFIG = 2


@dataclass(frozen=True)
class ClientConfig:
    prometheus_url: str | None = None
    auth: str | None = None
    ca_file: str | None = None
    munge_socket: str | None = None
    munge_restrict_uid: int | None = None
    timeout_s: float | None = None


def client_config_path() -> Path:
    return Path(os.environ.get(CLIENT_ENV) or DEFAULT_CLIENT_CONFIG)


def load_client_config(path: Path | None = None) -> ClientConfig:
    """The client config; empty when the file does not exist."""
    path = path or client_config_path()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return ClientConfig()
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ReportError(f"cannot read the client config {path}: {exc}; fix it or ask "
                          "the admins", EXIT_BAD_CLIENT_CONFIG) from None
    keys = {"prometheus_url": str, "auth": str, "ca_file": str, "munge_socket": str,
            "munge_restrict_uid": int, "timeout_seconds": (int, float)}
    for key, value in data.items():
        if key not in keys:
            raise ReportError(f"{path}: unknown key {key!r} (known: "
                              f"{', '.join(keys)})", EXIT_BAD_CLIENT_CONFIG)
        if not isinstance(value, keys[key]) or isinstance(value, bool):
            raise ReportError(f"{path}: {key} has the wrong type", EXIT_BAD_CLIENT_CONFIG)
    if data.get("auth", "none") not in AUTH_METHODS:
        raise ReportError(f"{path}: auth must be one of {', '.join(AUTH_METHODS)}",
                          EXIT_BAD_CLIENT_CONFIG)
    if not 0 <= data.get("munge_restrict_uid", 0) < 2**32 - 1:
        raise ReportError(f"{path}: munge_restrict_uid must be a uid (the proxy's)",
                          EXIT_BAD_CLIENT_CONFIG)
    timeout = data.get("timeout_seconds")
    return ClientConfig(prometheus_url=data.get("prometheus_url"), auth=data.get("auth"),
                        ca_file=data.get("ca_file"), munge_socket=data.get("munge_socket"),
                        munge_restrict_uid=data.get("munge_restrict_uid"),
                        timeout_s=float(timeout) if timeout is not None else None)
