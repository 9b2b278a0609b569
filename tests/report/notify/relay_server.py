"""A mail relay as sites run one, for tests: a real SMTP server (aiosmtpd, in the test's
process) that requires STARTTLS and AUTH, its certificate self-signed here and trusted
only through the CA file; or one that offers no STARTTLS and would take a password in
clear. And the password file a site would write."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import free_port

USER = "gpu-report"
PASSWORD = "Tr0ub4dor&3 horse"  # a space and a '&' too: the file's whole line
ADMIN = "gpu-admins@example.org"


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1, signed by its own key: (cert, key) PEM files."""
    # cryptography comes with ansible-core, a test dependency (pyproject.toml).
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "relay.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "relay.pem", directory / "relay.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@dataclass
class Relay:
    port: int
    ca_file: Path  # the server's own certificate: the only CA the client trusts
    inbox: list[bytes] = field(default_factory=list)
    logins: list[tuple[str, bool]] = field(default_factory=list)  # (user, accepted)
    sessions: list[tuple[bool, bool]] = field(default_factory=list)  # (TLS, authenticated)

    @property
    def url(self) -> str:
        return f"smtp://127.0.0.1:{self.port}"


def start_relay(tmp_path: Path, starttls: bool) -> tuple[Relay, Callable[[], None]]:
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult, LoginPassword

    cert, key = self_signed(tmp_path)
    relay = Relay(free_port(), cert)

    class Handler:
        async def handle_DATA(self, server, session, envelope):  # type: ignore[no-untyped-def]
            relay.inbox.append(envelope.content)
            relay.sessions.append((session.ssl is not None, session.authenticated))
            return "250 OK"

    def authenticator(server, session, envelope, mechanism, auth_data):  # type: ignore[no-untyped-def]
        good = (isinstance(auth_data, LoginPassword) and auth_data.login == USER.encode()
                and auth_data.password == PASSWORD.encode())
        relay.logins.append((auth_data.login.decode(errors="replace"), good))
        return AuthResult(success=good, handled=False)  # a failure: aiosmtpd says 535

    if starttls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        controller = Controller(Handler(), hostname="127.0.0.1", port=relay.port,
                                tls_context=context, require_starttls=True,
                                auth_required=True, auth_require_tls=True,
                                authenticator=authenticator)
    else:  # a server that offers no STARTTLS, and takes AUTH in clear
        controller = Controller(Handler(), hostname="127.0.0.1", port=relay.port,
                                auth_required=True, auth_require_tls=False,
                                authenticator=authenticator)
    controller.start()
    return relay, controller.stop


def password_file(tmp_path: Path, text: str = PASSWORD + "\n") -> Path:
    path = tmp_path / "smtp-password"
    path.write_text(text)
    path.chmod(0o600)
    return path
