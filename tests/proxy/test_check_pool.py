"""The query checkers (check_pool.py): real worker processes; a check that runs past
its time is killed and replaced, a crashed worker too, and the event loop never waits
on a parse."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from slurm_gpu_exporter.proxy.query.check_pool import CheckBusy, CheckPool
from slurm_gpu_exporter.proxy.query.restrict import QueryRefused, Scope

pytestmark = pytest.mark.process

ALICE = Scope(admin=False, users=frozenset({"alice"}))
ADMIN = Scope(admin=True)
# Inside every limit (27 bytes), yet the parser takes tens of milliseconds over each
# such regex (it compiles it); a handful of them take longer than a short time limit.
SLOW_REGEX = " or ".join(f'x{{a=~"(.{{0,1000}}){{0,{1000 + i}}}"}}' for i in range(12))


async def _loop_stall_during(pool: CheckPool, query: str, scope: Scope
                             ) -> tuple[float, BaseException | str]:
    """The longest the event loop went without running while ``query`` was checked,
    and the check's outcome."""
    longest, done = 0.0, asyncio.Event()

    async def ticker() -> None:
        nonlocal longest
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            longest, last = max(longest, now - last), now

    tick = asyncio.create_task(ticker())
    try:
        outcome: BaseException | str = await pool.check("query", query, scope)
    except QueryRefused as exc:
        outcome = exc
    done.set()
    await tick
    return longest, outcome


def test_a_check_past_its_time_is_killed_and_the_worker_replaced() -> None:
    async def run() -> None:
        pool = CheckPool(workers=1, time_limit=0.05)
        await pool.start()
        try:
            (first,) = pool._all
            stall, outcome = await _loop_stall_during(pool, SLOW_REGEX, ALICE)
            assert isinstance(outcome, QueryRefused) and outcome.reason == "slow_query"
            assert stall < 0.04, f"the event loop stalled {stall:.3f} s"
            assert pool.killed == 1
            assert await asyncio.wait_for(first.process.wait(), 5) == -9  # SIGKILL
            # The replacement answers the next query.
            assert await pool.check("query", "up", ALICE) == '{__name__="up",user="alice"}'
        finally:
            await pool.close()

    asyncio.run(run())


def test_killing_a_worker_never_polls_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # A poll (Process.kill does one) can reap a worker that just died before asyncio's
    # child watcher does; asyncio then reports exit 255 ("Unknown child process") and
    # the kill is lost. It took a loaded machine to lose that race, so the test checks
    # the cause: nothing of the pool's waits on a child outside asyncio.
    polled: list[int] = []
    poll = subprocess.Popen.poll

    def recording_poll(self: subprocess.Popen) -> int | None:
        if self.returncode is None:
            polled.append(self.pid)
        return poll(self)

    monkeypatch.setattr(subprocess.Popen, "poll", recording_poll)

    async def run() -> None:
        pool = CheckPool(workers=1, time_limit=0.05)
        await pool.start()
        try:
            (first,) = pool._all
            with pytest.raises(QueryRefused):
                await pool.check("query", SLOW_REGEX, ALICE)
            assert await asyncio.wait_for(first.process.wait(), 5) == -9
            await pool.check("query", "up", ALICE)
        finally:
            await pool.close()

    asyncio.run(run())
    assert polled == []


def test_a_crashed_worker_refuses_that_query_and_is_replaced() -> None:
    async def run() -> None:
        pool = CheckPool(workers=1)
        await pool.start()
        try:
            (worker,) = pool._all
            worker.process.kill()  # as a parser crash would end it
            with pytest.raises(QueryRefused) as refused:
                await pool.check("query", "up", ALICE)
            assert refused.value.reason == "parser_crash"
            assert await pool.check("selector", "up", ADMIN) == "up"
        finally:
            await pool.close()

    asyncio.run(run())


def test_refusals_come_back_with_their_reason() -> None:
    async def run() -> None:
        pool = CheckPool(workers=1)
        await pool.start()
        try:
            with pytest.raises(QueryRefused, match="does not parse") as refused:
                await pool.check("query", "sum(", ALICE)
            assert refused.value.reason == "bad_query"
            with pytest.raises(QueryRefused, match="only admins"):
                await pool.check("query", "info(up)", ALICE)
        finally:
            await pool.close()

    asyncio.run(run())


def test_past_the_waiting_limit_a_request_is_told_busy_and_the_waiting_are_served() -> None:
    async def run() -> None:
        pool = CheckPool(workers=1, time_limit=0.3, max_waiting=1)
        await pool.start()
        try:
            slow = asyncio.create_task(pool.check("query", SLOW_REGEX, ALICE))
            await asyncio.sleep(0.05)  # the one worker is busy with it
            waiting = asyncio.create_task(pool.check("query", "up", ALICE))
            await asyncio.sleep(0)
            with pytest.raises(CheckBusy):
                await pool.check("query", "up", ALICE)
            assert await waiting == '{__name__="up",user="alice"}'
            with pytest.raises(QueryRefused):
                await slow
        finally:
            await pool.close()

    asyncio.run(run())


def test_a_request_that_waits_too_long_is_told_busy() -> None:
    async def run() -> None:
        pool = CheckPool(workers=1, time_limit=0.5, wait_limit=0.05)
        await pool.start()
        try:
            slow = asyncio.create_task(pool.check("query", SLOW_REGEX, ALICE))
            await asyncio.sleep(0.05)
            with pytest.raises(CheckBusy, match="free for"):
                await pool.check("query", "up", ALICE)
            with pytest.raises(QueryRefused):
                await slow
            assert not pool._waiting  # the one that gave up is no longer in line
        finally:
            await pool.close()

    asyncio.run(run())


def test_answers_larger_than_a_pipe_buffer_come_back_whole() -> None:
    # A coordinator of many users: every selector gets the whole list, so the answer is
    # far larger than the query (and than the 64 KiB a pipe holds).
    users = frozenset(f"user{n:04d}.with.a.long.name" for n in range(200))
    coordinator = Scope(admin=False, users=users)
    query = " or ".join(f'slurm_job_gpus{{jobid="{n}"}}' for n in range(50))

    async def run() -> str:
        # What is checked here is the answer's size, not the time: a loaded machine took
        # more than the default 1 s to restrict this query for 200 users once.
        pool = CheckPool(workers=1, time_limit=30.0)
        await pool.start()
        try:
            return await pool.check("query", query, coordinator)
        finally:
            await pool.close()

    answer = asyncio.run(run())
    assert len(answer) > 256 * 1024
    assert answer.count("user0199\\\\.with") == 50


def test_a_worker_that_cannot_start_is_an_error_naming_its_command() -> None:
    command = (sys.executable, "-c", "import sys; sys.exit(3)")

    async def run() -> None:
        with pytest.raises(OSError, match=r"did not start \(IncompleteReadError, exit 3\)"):
            await CheckPool(workers=1, command=command).start()

    asyncio.run(run())
