"""The proxy's settings: flags, and the same settings in a YAML file (``--config``).

```yaml
prometheus_url: http://127.0.0.1:9090
admins: [root, hpcadmin]
public_metrics: [cluster:slurm_gpus:count]
account_users: {ml: [carol, dave]}      # who is in which account
coordinators: {carol: [ml]}             # a coordinator sees their accounts' users
user_header:                            # Grafana's send_user_header
  name: X-Grafana-User
  secret_header: X-Slurm-Gpu-Proxy-Secret
  secret_file: /etc/slurm-gpu-proxy/grafana.secret
  client_cert_sans: [grafana.example.org]
upstream_timeout_seconds: 120
```
Flags add to the file's lists; ``--prometheus-url`` replaces the file's. Unknown keys
are an error, so a typo cannot silently turn a restriction off.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from slurm_gpu_exporter.model.users import is_user_name
from slurm_gpu_exporter.proxy.query.restrict import Scope

_TOP_KEYS = {"prometheus_url", "admins", "public_metrics", "account_users", "coordinators",
             "user_header", "upstream_timeout_seconds"}
_HEADER_KEYS = {"name", "secret_header", "secret_file", "client_cert_sans"}
_HEADER_NAME = re.compile(r"[A-Za-z0-9-]+")


class ConfigError(Exception):
    """The proxy's settings are missing or invalid; the message says which and how to fix."""


@dataclass(frozen=True)
class UserHeader:
    """A user name in a request header, believed only from a client that proves itself:
    with the shared secret in ``secret_header``, or a client certificate with one of
    ``client_cert_sans``."""

    name: str
    secret_header: str | None = None
    secret: bytes | None = None
    client_cert_sans: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProxyConfig:
    prometheus_url: str
    admins: frozenset[str] = frozenset()
    public_metrics: frozenset[str] = frozenset()
    account_users: dict[str, frozenset[str]] = field(default_factory=dict)
    coordinators: dict[str, frozenset[str]] = field(default_factory=dict)
    user_header: UserHeader | None = None
    upstream_timeout: float = 120.0

    def scope_for(self, user: str) -> Scope:
        """What ``user`` may see: all (an admin), or their own series and those of the
        users of the accounts they coordinate, plus the public families."""
        if user in self.admins:
            return Scope(admin=True)
        users = {user}
        for account in self.coordinators.get(user, ()):
            users |= self.account_users.get(account, frozenset())
        return Scope(admin=False, users=frozenset(users), public=self.public_metrics)


def _names(where: str, value: Any) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} must be a list of names")
    return frozenset(value)


def _user_names(where: str, value: Any) -> frozenset[str]:
    names = _names(where, value)
    for name in names:
        if not is_user_name(name):
            raise ConfigError(f"{where}: {name!r} is not a user name (letters, digits, ._@+-)")
    return names


def _mapping(where: str, value: Any) -> dict[str, frozenset[str]]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping of name: [names]")
    return {str(k): _user_names(f"{where}.{k}", v) for k, v in value.items()}


def _user_header(data: Any, base: Path) -> UserHeader | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ConfigError("user_header must be a mapping")
    unknown = set(data) - _HEADER_KEYS
    if unknown:
        raise ConfigError(f"user_header: unknown key(s) {', '.join(sorted(unknown))}")
    name = data.get("name")
    if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
        raise ConfigError("user_header.name must be a header name, e.g. X-Grafana-User")
    secret_header, secret = data.get("secret_header"), None
    if (secret_header is None) != (data.get("secret_file") is None):
        raise ConfigError("user_header needs both secret_header and secret_file, or neither")
    if secret_header is not None:
        if not isinstance(secret_header, str) or not _HEADER_NAME.fullmatch(secret_header):
            raise ConfigError("user_header.secret_header must be a header name")
        path = base / str(data["secret_file"])
        try:
            secret = path.read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read user_header.secret_file {path}: "
                              f"{exc.strerror}") from None
        if len(secret) < 16:
            raise ConfigError(f"user_header.secret_file {path} holds fewer than 16 bytes; "
                              "use a long random secret (openssl rand -hex 32)")
    sans = tuple(_names("user_header.client_cert_sans", data.get("client_cert_sans")))
    if secret is None and not sans:
        raise ConfigError("user_header needs a proof: secret_header and secret_file, or "
                          "client_cert_sans; otherwise anyone could name any user")
    return UserHeader(name=name, secret_header=secret_header, secret=secret,
                      client_cert_sans=sans)


def parse_config(data: Any, base: Path) -> dict[str, Any]:
    """The settings of a loaded YAML document, as ProxyConfig keyword arguments."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("the proxy config must be a YAML mapping")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"proxy config: unknown key(s) {', '.join(sorted(unknown))}")
    out: dict[str, Any] = {
        "admins": _user_names("admins", data.get("admins")),
        "public_metrics": _names("public_metrics", data.get("public_metrics")),
        "account_users": _mapping("account_users", data.get("account_users")),
        "coordinators": {k: frozenset(v) for k, v in
                         _mapping("coordinators", data.get("coordinators")).items()},
        "user_header": _user_header(data.get("user_header"), base),
    }
    if not all(is_user_name(c) for c in out["coordinators"]):
        raise ConfigError("coordinators: every key must be a user name")
    if "prometheus_url" in data:
        out["prometheus_url"] = str(data["prometheus_url"])
    if "upstream_timeout_seconds" in data:
        timeout = data["upstream_timeout_seconds"]
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ConfigError("upstream_timeout_seconds must be a positive number")
        out["upstream_timeout"] = float(timeout)
    return out


def load_config(path: Path | None, prometheus_url: str | None, admins: list[str],
                public_metrics: list[str]) -> ProxyConfig:
    """The settings from the file (if any) and the flags together."""
    settings: dict[str, Any] = {}
    if path is not None:
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read proxy config {path}: {exc.strerror}") from None
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ConfigError(f"proxy config {path} is not valid YAML: "
                              f"{' '.join(str(exc).split())}") from None
        settings = parse_config(data, path.parent)
    if prometheus_url:
        settings["prometheus_url"] = prometheus_url
    if not settings.get("prometheus_url"):
        raise ConfigError("no Prometheus to forward to: give --prometheus-url URL "
                          "(or prometheus_url in --config)")
    url = settings["prometheus_url"]
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--prometheus-url {url!r} must start with http:// or https://")
    settings["prometheus_url"] = url.rstrip("/")
    settings["admins"] = settings.get("admins", frozenset()) | _user_names("--admin", admins)
    settings["public_metrics"] = (settings.get("public_metrics", frozenset())
                                  | frozenset(public_metrics))
    return ProxyConfig(**settings)
