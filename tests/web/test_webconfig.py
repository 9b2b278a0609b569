"""The web config file: the exporter-toolkit format, strictly validated."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path

import bcrypt
import pytest

from slurm_gpu_exporter.web.basic_auth import MAX_PENDING_CHECKS, AuthBusy, BasicAuth
from slurm_gpu_exporter.web.config import (
    WebConfigError,
    load_web_config,
    parse_web_config,
)
from tests.support import basic_auth

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()


def test_empty_config_means_plain_http_and_no_auth(tmp_path: Path) -> None:
    auth = BasicAuth()
    config = parse_web_config(None, tmp_path)
    assert config.ssl_context() is None
    assert auth.check(config, None)


def test_basic_auth_accepts_the_right_password_only() -> None:
    auth = BasicAuth()
    config = parse_web_config({"basic_auth_users": {"prom": HASH}}, Path("."))
    assert auth.check(config, basic_auth("prom", "s3cret"))
    assert auth.check(config, basic_auth("prom", "s3cret")), "cached answer stays right"
    assert not auth.check(config, basic_auth("prom", "wrong"))
    assert not auth.check(config, basic_auth("other", "s3cret"))
    assert not auth.check(config, None)
    assert not auth.check(config, "Basic !!!notbase64")
    assert not auth.check(config, "Bearer abc")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"tls_server_config": {"cert_file": "a.crt"}}, "both cert_file and key_file"),
        ({"tls_serverconfig": {}}, "unknown key"),
        ({None: None}, "unknown key.*None"),  # a file holding just "?"
        ({"tls_server_config": {1: "a", "cert_file": "a"}}, "unknown key.*1"),
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


# --- basic auth against hostile input (issue 19) ---------------------------------------


def test_a_password_over_72_bytes_is_refused_not_an_error_nor_cut() -> None:
    auth = BasicAuth()
    long = "p" * 72
    config = parse_web_config(
        {"basic_auth_users": {"prom": bcrypt.hashpw(long.encode(), bcrypt.gensalt(4)).decode()}},
        Path("."))
    assert auth.check(config, basic_auth("prom", long))
    # Same first 72 bytes: bcrypt 4 would accept it, bcrypt 5 raises (a 500 before).
    assert not auth.check(config, basic_auth("prom", long + "tail"))
    assert not auth.check(config, basic_auth("prom", "x" * 100))


@pytest.mark.parametrize("bad", [HASH[:-1], HASH[:7] + "$" + HASH[8:], "$2y$99$" + HASH[7:],
                                 HASH + "x"], ids=["cut", "no-cost-sign", "cost-99", "long"])
def test_a_malformed_hash_is_refused_at_load_with_its_line(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "web.yml"
    path.write_text(f"# comment\nbasic_auth_users:\n  good: '{HASH}'\n  prom: '{bad}'\n")
    with pytest.raises(WebConfigError, match=r"basic_auth_users\.prom \(line 4\): not a bcrypt"):
        load_web_config(path)


def test_an_unknown_user_is_checked_against_a_dummy_hash_of_the_same_cost() -> None:
    auth = BasicAuth()
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=5))
    config = parse_web_config({"basic_auth_users": {"prom": hashed.decode()}}, Path("."))
    checked: list[bytes] = []

    def check(password: bytes, against: bytes) -> bool:
        checked.append(against)
        return bcrypt.checkpw(password, against)

    config = dataclasses.replace(config, password_check=check)
    assert not auth.check(config, basic_auth("nobody", "s3cret"))
    assert not auth.check(config, basic_auth("prom", "wrong"))
    assert len(checked) == 2 and checked[0] != hashed and checked[0][:7] == b"$2b$05$"


def test_the_queue_of_password_checks_is_bounded() -> None:
    auth = BasicAuth()
    config = parse_web_config({"basic_auth_users": {"prom": HASH}}, Path("."))
    release = threading.Event()
    config = dataclasses.replace(
        config, password_check=lambda password, hashed: release.wait(10) and False)

    async def flood() -> tuple[int, int]:
        tasks = [asyncio.create_task(auth.check_async(config, basic_auth("prom", f"w{i}")))
                 for i in range(MAX_PENDING_CHECKS + 5)]
        await asyncio.sleep(0.1)
        release.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        busy = sum(isinstance(r, AuthBusy) for r in results)
        return busy, sum(r is False for r in results)

    busy, refused = asyncio.run(flood())
    assert (busy, refused) == (5, MAX_PENDING_CHECKS)


def test_one_credential_sent_on_many_connections_at_once_is_checked_once() -> None:
    """A report's concurrent queries carry the same new credential: one bcrypt check
    answers them all, and they do not fill the queue of checks."""
    auth = BasicAuth()
    config = parse_web_config({"basic_auth_users": {"prom": HASH}}, Path("."))
    release = threading.Event()
    calls: list[bytes] = []

    def check(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        release.wait(10)
        return bcrypt.checkpw(password, hashed)

    config = dataclasses.replace(config, password_check=check)

    async def together() -> list[object]:
        tasks = [asyncio.create_task(auth.check_async(config, basic_auth("prom", "s3cret")))
                 for _ in range(MAX_PENDING_CHECKS * 3)]
        await asyncio.sleep(0.1)
        release.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    assert asyncio.run(together()) == [True] * (MAX_PENDING_CHECKS * 3)
    assert len(calls) == 1
