"""``--web.config.file``: TLS, client certificates and basic auth, in the exporter-toolkit format.

The same YAML that node_exporter and every other Go exporter read::

    tls_server_config:
      cert_file: /etc/slurm-gpu-exporter/tls.crt
      key_file: /etc/slurm-gpu-exporter/tls.key
      client_auth_type: RequireAndVerifyClientCert   # optional
      client_ca_file: /etc/slurm-gpu-exporter/ca.crt
      min_version: TLS12
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2y$10$...   # bcrypt hash (htpasswd -nBC 10 prometheus)

Unknown keys are an error, as in exporter-toolkit, so a typo cannot silently
turn security off. Go-only knobs (cipher_suites, curve_preferences,
prefer_server_cipher_suites, http2) are accepted and ignored with a warning.

The parsed config is a frozen value; checking passwords against it, and what that
keeps at run time, is web/basic_auth.py's.
"""

from __future__ import annotations

import hmac
import logging
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import yaml


log = logging.getLogger(__name__)

_CLIENT_AUTH = {
    "": ssl.CERT_NONE,
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
             "max_version", "client_allowed_sans"}
_TLS_IGNORED = {"cipher_suites", "curve_preferences", "prefer_server_cipher_suites"}
_HTTP_KEYS = {"headers"}
_HTTP_IGNORED = {"http2"}
_TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users"}
# Headers exporter-toolkit refuses to let the config set, since the server owns them.
_RESERVED_HEADERS = {"authorization", "content-type", "content-encoding", "content-length",
                     "www-authenticate", "server"}


# A whole bcrypt hash: variant, cost 04-31, 22 characters of salt and 31 of hash.
_BCRYPT_RE = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")


class WebConfigError(Exception):
    """The web config file is missing, unreadable or invalid; the message says which."""


@dataclass(frozen=True)
class TlsSettings:
    cert_file: Path
    key_file: Path
    client_auth_type: str = ""
    client_ca_file: Path | None = None
    min_version: str = "TLS12"
    max_version: str = ""
    client_allowed_sans: tuple[str, ...] = ()


def _checkpw(password: bytes, hashed: bytes) -> bool:
    """bcrypt's check. bcrypt and yaml are imported when a web config asks for them,
    not with the agent: most agents run without one, and every module imported stays
    in the agent's resident memory for its whole life."""
    import bcrypt

    return bool(bcrypt.checkpw(password, hashed))


@dataclass(frozen=True)
class WebConfig:
    """A parsed web config: an optional TLS setup, extra headers and basic-auth users.

    A value: the servers share it across threads and a re-read replaces it whole. What
    checking passwords keeps at run time (verified credentials, bcrypt threads) is the
    server's own (web/basic_auth.py)."""

    tls: TlsSettings | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    users: Mapping[str, bytes] = field(default_factory=dict)
    # bcrypt's check; tests pass a slow one to see that it does not block the server.
    password_check: Callable[[bytes, bytes], bool] = _checkpw

    def __post_init__(self) -> None:
        # Read-only copies: no one can change the config in force under a request.
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))
        object.__setattr__(self, "users", MappingProxyType(dict(self.users)))

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server TLS context, or None for plain HTTP."""
        if self.tls is None:
            return None
        tls = self.tls
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            ctx.load_cert_chain(tls.cert_file, tls.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(f"cannot load TLS certificate {tls.cert_file} / key "
                                 f"{tls.key_file}: {exc}") from None
        ctx.minimum_version = _TLS_VERSIONS[tls.min_version]
        if tls.max_version:
            ctx.maximum_version = _TLS_VERSIONS[tls.max_version]
        ctx.verify_mode = _CLIENT_AUTH[tls.client_auth_type]
        if tls.client_ca_file is not None:
            try:
                ctx.load_verify_locations(cafile=str(tls.client_ca_file))
            except (OSError, ssl.SSLError) as exc:
                raise WebConfigError(f"cannot load client CA file {tls.client_ca_file}: "
                                     f"{exc}") from None
        return ctx

    def client_cert_allowed(self, peercert: dict[str, Any] | None) -> bool:
        """True unless client_allowed_sans is set and the client certificate has none of them."""
        if self.tls is None or not self.tls.client_allowed_sans:
            return True
        if not peercert:
            return False
        sans = {value for _, value in peercert.get("subjectAltName", ())}
        return any(hmac.compare_digest(a, b) for a in self.tls.client_allowed_sans for b in sans)


def _check_keys(section: str, data: dict[str, Any], allowed: set[str], ignored: set[str]) -> None:
    unknown = set(data) - allowed - ignored
    if unknown:
        # YAML keys can be null, numbers or lists (a lone "?" is {None: None}): say them.
        names = sorted(repr(k) if not isinstance(k, str) else k for k in unknown)
        raise WebConfigError(f"{section}: unknown key(s) {', '.join(names)}")
    for key in sorted(set(data) & ignored):
        log.warning("web config: %s.%s is not supported by this exporter and is ignored",
                    section, key)


def parse_web_config(data: Any, base: Path,
                     user_lines: Callable[[], dict[str, int]] | None = None) -> WebConfig:
    """Validate a loaded YAML document; relative paths are resolved against ``base``.

    ``user_lines`` (asked only for an error: user -> line of the file) lets a bad
    hash's error name its line."""
    if data is None:
        return WebConfig()
    if not isinstance(data, dict):
        raise WebConfigError("the web config must be a YAML mapping")
    _check_keys("web config", data, _TOP_KEYS, set())
    settings: TlsSettings | None = None

    tls = data.get("tls_server_config") or {}
    if not isinstance(tls, dict):
        raise WebConfigError("tls_server_config must be a mapping")
    _check_keys("tls_server_config", tls, _TLS_KEYS, _TLS_IGNORED)
    cert, key = tls.get("cert_file") or "", tls.get("key_file") or ""
    if bool(cert) != bool(key):
        raise WebConfigError("tls_server_config needs both cert_file and key_file")
    auth_type = tls.get("client_auth_type") or ""
    if auth_type not in _CLIENT_AUTH:
        raise WebConfigError(f"tls_server_config.client_auth_type {auth_type!r} is not one of "
                             f"{', '.join(k for k in _CLIENT_AUTH if k)}")
    for name in ("min_version", "max_version"):
        if tls.get(name) and tls[name] not in _TLS_VERSIONS:
            raise WebConfigError(f"tls_server_config.{name} {tls[name]!r} is not one of "
                                 f"{', '.join(_TLS_VERSIONS)}")
    if cert:
        ca = tls.get("client_ca_file")
        if auth_type not in ("", "NoClientCert") and not ca:
            # Python's TLS cannot ask for a client certificate without verifying it,
            # so every mode that asks for one needs the CA to verify against.
            raise WebConfigError(f"client_auth_type {auth_type} needs client_ca_file")
        sans = tls.get("client_allowed_sans") or []
        if not isinstance(sans, list) or not all(isinstance(s, str) for s in sans):
            raise WebConfigError("tls_server_config.client_allowed_sans must be a list of "
                                 "strings")
        settings = TlsSettings(
            cert_file=base / cert,
            key_file=base / key,
            client_auth_type=auth_type,
            client_ca_file=base / ca if ca else None,
            min_version=tls.get("min_version") or "TLS12",
            max_version=tls.get("max_version") or "",
            client_allowed_sans=tuple(sans),
        )
    elif auth_type or tls.get("client_ca_file"):
        raise WebConfigError("client certificate settings need cert_file and key_file")

    http = data.get("http_server_config") or {}
    if not isinstance(http, dict):
        raise WebConfigError("http_server_config must be a mapping")
    _check_keys("http_server_config", http, _HTTP_KEYS, _HTTP_IGNORED)
    headers = http.get("headers") or {}
    if not isinstance(headers, dict):
        raise WebConfigError("http_server_config.headers must be a mapping")
    extra: dict[str, str] = {}
    for name, value in headers.items():
        if str(name).lower() in _RESERVED_HEADERS:
            raise WebConfigError(f"http_server_config.headers: {name} cannot be set here")
        extra[str(name)] = str(value)

    users = data.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        raise WebConfigError("basic_auth_users must be a mapping of user: bcrypt hash")
    hashes: dict[str, bytes] = {}
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not _BCRYPT_RE.fullmatch(hashed):
            line = user_lines().get(str(user)) if user_lines else None
            where = f" (line {line})" if line else ""
            raise WebConfigError(f"basic_auth_users.{user}{where}: not a bcrypt hash, or a cut "
                                 "one "
                                 "(make one with: htpasswd -nBC 10 USER)")
        hashes[str(user)] = hashed.encode()
    return WebConfig(tls=settings, headers=extra, users=hashes)


def load_web_config(path: Path) -> WebConfig:
    """Read and validate a web config file."""
    import yaml  # with the first config file, not with the agent (see _checkpw)

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WebConfigError(f"cannot read web config {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise WebConfigError(f"web config {path} is not UTF-8 text (byte {exc.start})"
                             ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WebConfigError(f"web config {path} is not valid YAML: {_yaml_problem(exc)}"
                             ) from None
    except RecursionError:  # the YAML parser recurses once per level of nesting
        raise WebConfigError(f"web config {path} is nested too deeply to be a web config"
                             ) from None
    config = parse_web_config(data, path.parent, lambda: _user_lines(text))
    config.ssl_context()  # fail at start-up, not at the first scrape
    return config


def _user_lines(text: str) -> dict[str, int]:
    """basic_auth_users' user -> the 1-based line of its hash, for error messages."""
    import yaml

    node = yaml.compose(text, Loader=yaml.SafeLoader)
    if not isinstance(node, yaml.MappingNode):
        return {}
    for key, value in node.value:
        if key.value == "basic_auth_users" and isinstance(value, yaml.MappingNode):
            return {str(k.value): v.start_mark.line + 1 for k, v in value.value}
    return {}


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """The parser's error in one line: where (1-based line and column) and what."""
    import yaml

    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        what = exc.problem or exc.context or "parse error"
        if exc.problem and exc.context:
            what = f"{exc.problem} ({exc.context})"
        if mark is not None:
            return f"line {mark.line + 1}, column {mark.column + 1}: {what}"
        return what
    return " ".join(str(exc).split())
