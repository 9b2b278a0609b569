"""The query checkers' pool with stand-in workers in process (what it asks them, a
worker past its time, one that stops, a pool with none free), munge's audience rule,
the munge queue when full, the archive read past its time and the back-off memory."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurm_gpu_exporter.model.munge_wire import PREFIX
from slurm_gpu_exporter.proxy import archive as archive_module
from slurm_gpu_exporter.proxy import munge as munge_module
from slurm_gpu_exporter.proxy.archive import ArchiveReader, ArchiveUnavailable
from slurm_gpu_exporter.proxy.fairness import Backoff
from slurm_gpu_exporter.proxy.munge import UPGRADE, MungeDecoder, MungeRefusal, audience_refusal
from slurm_gpu_exporter.proxy.query.check_pool import CheckBusy, CheckPool
from slurm_gpu_exporter.proxy.query.check_worker import answer
from slurm_gpu_exporter.proxy.query.restrict import QueryRefused, Scope

ALICE = Scope(admin=False, users=frozenset({"alice"}), public=frozenset({"a:b"}))


class Worker:
    """A checker process stand-in: answers with the checker's own ``answer``."""

    def __init__(self, delay: float = 0.0, crash: bool = False) -> None:
        self.process = SimpleNamespace(pid=4242, returncode=None)
        self.delay, self.crash = delay, crash
        self.asked: list[dict] = []
        self.killed = False

    async def ask(self, request: dict) -> dict:
        self.asked.append(request)
        await asyncio.sleep(self.delay)
        if self.crash:
            raise asyncio.IncompleteReadError(b"", 4)
        return answer(request)

    def signal_kill(self) -> None:
        self.killed = True

    async def kill(self) -> None:
        self.killed = True


def pool_with(*workers: Worker, **settings: float) -> CheckPool:
    pool = CheckPool(**settings)  # type: ignore[arg-type]
    pool._idle.extend(workers)  # type: ignore[arg-type]
    pool._all.update(workers)  # type: ignore[arg-type]
    pool.closed = True  # a replaced worker is not started again (no process here)
    return pool


def test_the_pool_asks_a_worker_for_the_text_scope_and_kind() -> None:
    worker = Worker()
    pool = pool_with(worker)
    assert asyncio.run(pool.check("query", "up", ALICE)) == '{__name__="up",user="alice"}'
    assert worker.asked == [{"kind": "query", "text": "up", "admin": False,
                             "users": ["alice"], "public": ["a:b"]}]
    assert asyncio.run(pool.check("query", "a:b", ALICE)) == '{__name__="a:b"}'
    with pytest.raises(QueryRefused) as caught:
        asyncio.run(pool.check("selector", "sum(up)", ALICE))
    assert (str(caught.value), caught.value.reason) == (
        "match[] 'sum(up)' is not a series selector", "bad_query")
    assert pool._idle == [worker]  # handed back after each answer


def test_a_worker_past_its_time_is_killed_and_the_query_refused(
        caplog: pytest.LogCaptureFixture) -> None:
    worker = Worker(delay=1.0)
    pool = pool_with(worker, time_limit=0.05)
    with caplog.at_level(logging.WARNING), pytest.raises(QueryRefused) as caught:
        asyncio.run(pool.check("query", "up", ALICE))
    assert (str(caught.value), caught.value.reason) == (
        "query took longer than 0.05 s to check; simplify it", "slow_query")
    assert pool.killed == 1 and worker.killed and pool._idle == []
    assert caplog.messages == ["query checker 4242 ran past its time limit; starting another"]


def test_a_worker_that_stops_is_replaced_and_the_query_refused(
        caplog: pytest.LogCaptureFixture) -> None:
    worker = Worker(crash=True)
    pool = pool_with(worker)
    with caplog.at_level(logging.WARNING), pytest.raises(QueryRefused) as caught:
        asyncio.run(pool.check("query", "up", ALICE))
    assert (str(caught.value), caught.value.reason) == (
        "query could not be checked: the parser stopped on it; simplify it", "parser_crash")
    assert pool.killed == 0 and worker.killed
    assert caplog.messages == [
        "query checker 4242 stopped (IncompleteReadError, exit None); starting another"]


def test_with_no_worker_free_a_check_waits_its_limit_then_is_busy() -> None:
    with pytest.raises(CheckBusy) as caught:
        asyncio.run(pool_with(wait_limit=0.05).check("query", "up", ALICE))
    assert str(caught.value) == "no query checker was free for 0.05 s"
    with pytest.raises(CheckBusy) as caught:
        asyncio.run(pool_with(max_waiting=0).check("query", "up", ALICE))
    assert str(caught.value) == "0 queries wait to be checked"


def test_a_waiting_check_gets_the_worker_handed_back() -> None:
    async def run() -> list[str]:
        worker = Worker(delay=0.05)
        pool = pool_with(worker)
        return list(await asyncio.gather(pool.check("query", "up", ALICE),
                                         pool.check("query", "a:b", ALICE)))
    assert asyncio.run(run()) == ['{__name__="up",user="alice"}', '{__name__="a:b"}']


AUDIENCES = frozenset({"https://proxy.example:9818"})


def test_a_credential_made_for_this_proxy_names_it() -> None:
    assert audience_refusal(f"{PREFIX}https://proxy.example:9818\n".encode(), AUDIENCES) is None


def test_a_credential_without_a_payload_is_the_old_kind() -> None:
    assert audience_refusal(b"", AUDIENCES) == MungeRefusal(
        401, "munge_no_audience", f"this proxy takes only munge credentials made for it, not "
        f"{UPGRADE} (it then makes one with the payload '{PREFIX}<the proxy's URL>')")


def test_a_credential_for_another_service_says_which_or_that_it_is_another() -> None:
    made_for = audience_refusal(f"{PREFIX}https://other.example".encode(), AUDIENCES)
    assert made_for == MungeRefusal(
        401, "munge_wrong_audience", "this munge credential was made for "
        "'https://other.example', not this proxy (https://proxy.example:9818): give one of "
        "these as --prometheus-url, or ask the proxy's admins to add yours with "
        "--munge.audience")
    for payload in (b"hello", f"{PREFIX}ftp://x".encode()):
        refusal = audience_refusal(payload, frozenset())
        assert refusal is not None and refusal.message.startswith(
            "this munge credential was made for another service, not this proxy (none):")


def test_a_full_munge_queue_is_503(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(munge_module, "QUEUE_WAIT_S", 0.02)
    decoder = MungeDecoder(Path("/run/munge.sock"), unmunge="/bin/false", max_concurrent=1)

    async def run() -> object:
        await decoder._slots.acquire()  # one credential being decoded
        return await decoder.decode("MUNGE:AwQFAAC" + "A" * 40 + ":")
    assert asyncio.run(run()) == MungeRefusal(
        503, "munge_busy", "too many munge credentials are being checked at once; try again "
        "in a moment")


def test_an_archive_read_past_its_time_is_unavailable(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    monkeypatch.setattr(archive_module, "READ_TIMEOUT_S", 0.05)
    reader = ArchiveReader(f"sqlite:///{tmp_path}/a.db")
    monkeypatch.setattr(reader, "_read", lambda jobid, cluster: __import__("time").sleep(0.3))
    with pytest.raises(ArchiveUnavailable) as caught:
        asyncio.run(reader.job("7", None))
    assert str(caught.value) == f"the archive {reader.where} did not answer within 0.05 s"


def test_the_back_off_forgets_users_struck_long_ago_once_it_holds_many() -> None:
    now = [0.0]
    backoff = Backoff(clock=lambda: now[0])
    for _ in range(7):
        backoff.strike("often")  # waits the longest: until 60
    for i in range(1024):
        backoff.strike(f"u{i}")
    now[0] = 310.0  # everyone's last strike is past the 300 s to forget
    assert backoff.strike("new") == 1.0
    assert set(backoff._strikes) == {"new"}
