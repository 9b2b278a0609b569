"""What a server's basic-auth checks keep at run time (web/basic_auth.py), apart from the
web config they check against, which is a frozen value."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path

import bcrypt
import pytest

from slurm_gpu_exporter.web.basic_auth import BCRYPT_WORKERS, BasicAuth
from slurm_gpu_exporter.web.config import WebConfig, parse_web_config
from tests.support import basic_auth

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()


def _counting(calls: list[bytes]) -> WebConfig:
    def check(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return bcrypt.checkpw(password, hashed)

    return WebConfig(users={"prom": HASH.encode()}, password_check=check)


def test_the_web_config_is_a_frozen_value() -> None:
    config = parse_web_config({"basic_auth_users": {"prom": HASH},
                               "http_server_config": {"headers": {"X-A": "1"}}}, Path("."))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.users = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.users["eve"] = HASH.encode()  # type: ignore[index]
    with pytest.raises(TypeError):
        config.headers["X-A"] = "2"  # type: ignore[index]
    assert dict(config.headers) == {"X-A": "1"} and set(config.users) == {"prom"}


def test_a_reread_config_keeps_the_credentials_verified_while_user_and_hash_stay() -> None:
    auth, calls = BasicAuth(), []
    first = _counting(calls)
    assert auth.check(first, basic_auth("prom", "s3cret")) and len(calls) == 1
    # A re-read: a new config value with the same user and hash, and one more user.
    again = dataclasses.replace(first, users={"prom": HASH.encode(), "other": HASH.encode()})
    assert auth.check(again, basic_auth("prom", "s3cret")) and len(calls) == 1
    # The user's hash changed (same password): checked again.
    rehashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4))
    changed = dataclasses.replace(first, users={"prom": rehashed})
    assert auth.check(changed, basic_auth("prom", "s3cret")) and len(calls) == 2
    # The user is gone: refused, whatever was verified before.
    gone = dataclasses.replace(first, users={"other": HASH.encode()})
    assert not auth.check(gone, basic_auth("prom", "s3cret"))


def test_two_servers_keep_their_own_verified_credentials() -> None:
    calls: list[bytes] = []
    config = _counting(calls)
    assert BasicAuth().check(config, basic_auth("prom", "s3cret"))
    assert BasicAuth().check(config, basic_auth("prom", "s3cret"))
    assert len(calls) == 2


def test_at_most_two_password_checks_run_at_once() -> None:
    running, most = 0, 0
    lock, release = threading.Lock(), threading.Event()

    def check(password: bytes, hashed: bytes) -> bool:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        release.wait(10)
        with lock:
            running -= 1
        return False

    config = WebConfig(users={"prom": HASH.encode()}, password_check=check)
    auth = BasicAuth()

    async def wrong_ones() -> list[bool]:
        tasks = [asyncio.create_task(auth.check_async(config, basic_auth("prom", f"w{i}")))
                 for i in range(6)]
        await asyncio.sleep(0.2)
        release.set()
        return await asyncio.gather(*tasks)

    assert asyncio.run(wrong_ones()) == [False] * 6
    assert most == BCRYPT_WORKERS == 2
