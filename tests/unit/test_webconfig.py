"""The web config file: the exporter-toolkit format, strictly validated."""

from __future__ import annotations

import base64
from pathlib import Path

import bcrypt
import pytest

from slurm_gpu_exporter.webconfig import WebConfigError, load_web_config, parse_web_config

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_empty_config_means_plain_http_and_no_auth(tmp_path: Path) -> None:
    config = parse_web_config(None, tmp_path)
    assert config.ssl_context() is None
    assert config.check_basic_auth(None)


def test_basic_auth_accepts_the_right_password_only() -> None:
    config = parse_web_config({"basic_auth_users": {"prom": HASH}}, Path("."))
    assert config.check_basic_auth(_basic("prom", "s3cret"))
    assert config.check_basic_auth(_basic("prom", "s3cret")), "cached answer stays right"
    assert not config.check_basic_auth(_basic("prom", "wrong"))
    assert not config.check_basic_auth(_basic("other", "s3cret"))
    assert not config.check_basic_auth(None)
    assert not config.check_basic_auth("Basic !!!notbase64")
    assert not config.check_basic_auth("Bearer abc")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"tls_server_config": {"cert_file": "a.crt"}}, "both cert_file and key_file"),
        ({"tls_serverconfig": {}}, "unknown key"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "bogus": 1}}, "unknown key"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b",
                                "client_auth_type": "Sometimes"}}, "client_auth_type"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b",
                                "client_auth_type": "RequireAndVerifyClientCert"}},
         "needs client_ca_file"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "min_version": "SSL3"}},
         "min_version"),
        ({"basic_auth_users": {"prom": "plaintext"}}, "not a bcrypt hash"),
        ({"http_server_config": {"headers": {"Content-Type": "x"}}}, "cannot be set"),
        ([1, 2], "YAML mapping"),
    ],
)
def test_invalid_configs_are_refused_with_the_reason(data: object, message: str) -> None:
    with pytest.raises(WebConfigError, match=message):
        parse_web_config(data, Path("."))


def test_missing_certificate_fails_at_load_not_at_first_scrape(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n")
    with pytest.raises(WebConfigError, match="cannot load TLS certificate"):
        load_web_config(path)


def test_unreadable_or_invalid_yaml_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WebConfigError, match="cannot read"):
        load_web_config(tmp_path / "missing.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text("basic_auth_users: [unclosed\n")
    with pytest.raises(WebConfigError, match="not valid YAML"):
        load_web_config(bad)


def test_invalid_yaml_is_one_line_with_file_line_column_and_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("basic_auth_users:\n  prom: x\n bad: indent\n")
    with pytest.raises(WebConfigError) as caught:
        load_web_config(bad)
    message = str(caught.value)
    assert "\n" not in message
    assert str(bad) in message
    assert "line 3, column 2" in message
    assert "expected <block end>" in message


def test_a_web_config_that_is_not_utf8_is_refused_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yml"
    bad.write_bytes(b"basic_auth_users:\n  pr\xf6m: x\n")
    with pytest.raises(WebConfigError, match="not UTF-8") as caught:
        load_web_config(bad)
    assert "\n" not in str(caught.value)
