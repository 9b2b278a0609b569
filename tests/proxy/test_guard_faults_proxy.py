"""The proxy's guards on plain values: what a munge identity's user name and unmunge's
exit status decide, and the query checkers' time limit. unmunge and the checker worker
are stood in for (no process starts); tests/proxy/test_proxy_munge.py and
tests/proxy/test_check_pool.py run the real ones."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request

from slurm_gpu_exporter.proxy.config import UserHeader
from slurm_gpu_exporter.proxy.identity import Caller, Refusal, _munge_caller, identify
from slurm_gpu_exporter.proxy.munge import MungeDecoder, MungeRefusal, MungeUser
from slurm_gpu_exporter.proxy.query.check_pool import CheckPool
from slurm_gpu_exporter.proxy.query.restrict import QueryRefused, Scope
from slurm_gpu_exporter.web.basic_auth import BasicAuth
from slurm_gpu_exporter.web.config import WebConfig
from tests.support import basic_auth

CREDENTIAL = "MUNGE:AwQFAAB+abc/9==:"


class Decoder:
    """A munge decoder that says the credential is ``who``'s."""

    def __init__(self, who: MungeUser | MungeRefusal) -> None:
        self.who = who

    async def decode(self, credential: str) -> MungeUser | MungeRefusal:
        return self.who


@pytest.mark.parametrize("name", ["al ice", "alice\nX-Admin: 1", "-alice", "a/b", "",
                                  "a" * 200])
def test_a_munge_identity_whose_name_is_no_user_name_is_refused(name: str) -> None:
    who = asyncio.run(_munge_caller(CREDENTIAL, Decoder(MungeUser(1001, name))))  # type: ignore[arg-type]
    assert isinstance(who, Refusal) and (who.status, who.reason) == (401, "bad_credentials")


def test_a_munge_identity_with_a_user_name_is_that_caller() -> None:
    who = asyncio.run(_munge_caller(CREDENTIAL, Decoder(MungeUser(1001, "alice"))))  # type: ignore[arg-type]
    assert who == Caller("alice", "munge")


class Unmunge:
    """What ``unmunge`` answers: its exit status and what it printed."""

    def __init__(self, status: int, out: bytes, err: bytes = b"") -> None:
        self.returncode: int | None = None
        self._answer = (status, out, err)
        self.argv: tuple[str, ...] = ()

    async def __call__(self, *argv: str, **_kw: Any) -> Unmunge:
        self.argv = argv
        return self

    async def communicate(self, _stdin: bytes) -> tuple[bytes, bytes]:
        self.returncode, out, err = self._answer
        return out, err


AUDIENCE = "https://proxy.example.org:9443"


def _decode(monkeypatch: pytest.MonkeyPatch, unmunge: Unmunge) -> MungeUser | MungeRefusal:
    monkeypatch.setattr(asyncio, "create_subprocess_exec", unmunge)
    decoder = MungeDecoder(unmunge="/usr/bin/unmunge", audiences=[AUDIENCE])
    return asyncio.run(decoder.decode(CREDENTIAL))


@pytest.mark.parametrize("status, reason", [(15, "munge_expired"), (17, "munge_replayed"),
                                            (11, "munge_invalid"), (1, "munge_invalid")])
def test_unmunges_failure_is_a_refusal_whatever_it_printed(
        monkeypatch: pytest.MonkeyPatch, status: int, reason: str) -> None:
    # unmunge may still print the metadata of a credential it refuses (an expired or
    # replayed one is well formed): only its exit status says whether it is good.
    who = _decode(monkeypatch, Unmunge(status, b"UID: 0\n\nslurm-gpu-proxy "
                                       + AUDIENCE.encode(), b"unmunge: Error: ..."))
    assert isinstance(who, MungeRefusal) and (who.status, who.reason) == (401, reason)


def test_unmunges_success_names_the_uids_user(monkeypatch: pytest.MonkeyPatch) -> None:
    # unmunge's metadata, a blank line, then the payload: the proxy it was made for.
    unmunge = Unmunge(0, b"UID:             0\n\nslurm-gpu-proxy " + AUDIENCE.encode())
    assert _decode(monkeypatch, unmunge) == MungeUser(0, "root")
    assert unmunge.argv[0] == "/usr/bin/unmunge" and "--numeric" in unmunge.argv


class HangingWorker:
    """A checker worker that never answers (a parse that does not end)."""

    class Process:
        pid, returncode = 0, None
        stdin = stdout = None

    def __init__(self) -> None:
        self.process = self.Process()
        self.killed = False

    async def ask(self, request: dict) -> dict:  # type: ignore[type-arg]
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    def signal_kill(self) -> None:
        self.killed = True

    async def kill(self) -> None:
        self.killed = True


def test_a_check_past_the_time_limit_is_refused_and_its_worker_killed() -> None:
    async def check() -> tuple[BaseException | None, HangingWorker, CheckPool]:
        pool = CheckPool(workers=1, time_limit=0.2)
        worker = HangingWorker()
        pool._idle.append(worker)  # type: ignore[arg-type]
        pool.closed = True  # no replacement is started (it would be a process)
        try:
            async with asyncio.timeout(10):
                await pool.check("query", "up", Scope(admin=False,
                                                      users=frozenset({"alice"})))
        except (QueryRefused, TimeoutError) as exc:
            return exc, worker, pool
        return None, worker, pool

    refused, worker, pool = asyncio.run(check())
    assert isinstance(refused, QueryRefused) and refused.reason == "slow_query", refused
    assert worker.killed and pool.killed == 1


def _request(headers: dict[str, str]) -> Any:
    return make_mocked_request("GET", "/api/v1/query", headers=headers)


def test_a_basic_auth_user_whose_name_is_no_user_name_is_refused() -> None:
    # The web config's user names are the site's, and a name with a space or a newline
    # could still be in it: the password check passes, the name must not become a matcher.
    config = WebConfig(users={"al ice": b"h", "alice": b"h"},
                       password_check=lambda _pw, _hash: True)
    bad_name = {"Authorization": basic_auth("al ice", "pw")}
    who = asyncio.run(identify(_request(bad_name), config, None, auth=BasicAuth()))
    assert isinstance(who, Refusal) and (who.status, who.reason) == (401, "bad_credentials")
    good_name = {"Authorization": basic_auth("alice", "pw")}
    who = asyncio.run(identify(_request(good_name), config, None, auth=BasicAuth()))
    assert who == Caller("alice", "basic")


def test_a_user_header_from_a_client_that_did_not_prove_itself_is_refused() -> None:
    header = UserHeader("X-Grafana-User", secret_header="X-Proxy-Secret", secret=b"s3cret")
    config = WebConfig()
    forged = asyncio.run(identify(_request({"X-Grafana-User": "admin"}), config, header,
                                  auth=BasicAuth()))
    assert isinstance(forged, Refusal) and forged.reason == "forged_user_header"
    wrong = asyncio.run(identify(_request({"X-Grafana-User": "admin",
                                           "X-Proxy-Secret": "guess"}), config, header,
                                 auth=BasicAuth()))
    assert isinstance(wrong, Refusal) and wrong.reason == "forged_user_header"
    proven = asyncio.run(identify(_request({"X-Grafana-User": "alice",
                                            "X-Proxy-Secret": "s3cret"}), config, header,
                                  auth=BasicAuth()))
    assert proven == Caller("alice", "header")
