"""Each user's share (fairness.PerUser), the back-off after killed queries
(fairness.Backoff) and the bound on regex repetition counts (limits.py): pure logic."""

from __future__ import annotations

import asyncio

import pytest

from slurm_gpu_exporter.proxy.fairness import BackingOff, Backoff, Busy, PerUser
from slurm_gpu_exporter.proxy.query.limits import (
    LimitExceeded,
    check_regex_repetition,
    repetition_weight,
)
from tests.support import Clock
from tests.support.daemons import DEPLOY
from tests.system.observe import grafana


async def _shares() -> dict[str, object]:
    share = PerUser("checks", limit=1, max_waiting=1, wait_limit=0.3)
    seen: dict[str, object] = {}
    alice_in = asyncio.Event()
    let_go = asyncio.Event()

    async def alice_holds() -> None:
        async with share.slot("alice"):
            alice_in.set()
            await let_go.wait()

    holder = asyncio.ensure_future(alice_holds())
    await alice_in.wait()
    # bob is not behind alice: his slot comes at once.
    async with asyncio.timeout(0.05), share.slot("bob"):
        seen["bob_running"] = share.running("bob")
    # alice's second waits; her third is past what may wait.
    second = asyncio.ensure_future(share.slot("alice").__aenter__())
    await asyncio.sleep(0)
    try:
        async with share.slot("alice"):
            seen["third"] = "let in"
    except Busy as exc:
        seen["third"] = exc.retry_after
    # The waiting one times out while alice's first still runs.
    try:
        await second
    except Busy:
        seen["second"] = "busy"
    let_go.set()
    await holder
    seen["users_left"] = len(share)
    return seen


def test_one_users_slots_do_not_hold_up_another_and_their_surplus_is_told_busy() -> None:
    seen = asyncio.run(_shares())
    assert seen["bob_running"] == 1
    assert seen["third"] == 1  # Busy, retry in 1 s
    assert seen["second"] == "busy"
    assert seen["users_left"] == 0  # nothing kept of a user with nothing in flight


async def _handed_on() -> list[str]:
    share = PerUser("checks", limit=1, max_waiting=4, wait_limit=5)
    order: list[str] = []

    async def one(name: str) -> None:
        async with share.slot("alice"):
            order.append(name)
            await asyncio.sleep(0.01)

    await asyncio.gather(*(one(str(i)) for i in range(4)))
    assert share.running("alice") == 0 and len(share) == 0
    return order


def test_a_users_waiting_requests_run_one_at_a_time_in_turn() -> None:
    assert asyncio.run(_handed_on()) == ["0", "1", "2", "3"]


def _wait_of(backoff: Backoff, user: str) -> int | None:
    try:
        backoff.check(user)
    except BackingOff as exc:
        return exc.retry_after
    return None


def test_a_user_whose_queries_keep_being_killed_waits_ever_longer() -> None:
    clock = Clock()
    backoff = Backoff(first=1, longest=8, forget=300, clock=clock)
    assert _wait_of(backoff, "alice") is None
    waits = []
    for _ in range(6):
        waits.append(backoff.strike("alice"))
        assert _wait_of(backoff, "alice") == waits[-1]
        assert _wait_of(backoff, "bob") is None  # nobody else waits
        clock.now += waits[-1]  # the wait is over
        assert _wait_of(backoff, "alice") is None
    assert waits == [1, 2, 4, 8, 8, 8]
    clock.now += 301  # forgiven
    assert backoff.strike("alice") == 1


def test_many_kills_never_overflow_the_wait() -> None:
    backoff = Backoff(first=1, longest=60, clock=Clock())
    for _ in range(2000):
        wait = backoff.strike("alice")
    assert wait == 60


# The issue's query: 20 regexes of \w{300}, 313 bytes, seconds to parse.
ISSUE_QUERY = "x{" + ",".join(f'l{i}=~"\\\\w{{300}}"' for i in range(20)) + "}"


@pytest.mark.parametrize("query", [
    ISSUE_QUERY,
    'x{a=~"\\\\w{101}"}',
    'x{a=~"a{0,101}"}',
    'x{a=~"a{ 500 , }"}',
    'x{a=~"((\\\\w{10}){10}){10}"}',  # 1,110 nested: seconds, though each count is small
    " or ".join(f'x{{l{i}=~"\\\\w{{100}}"}}' for i in range(3)),  # 300 in all
    'x{a=~"\\\\w{\\x33\\x30\\x30}"}',  # \w{300} with the digits escaped
    'x{a=~"\\\\w\\u007b300}"}',
    'x{a=~"\\\\w{3\\060\\060}"}',
], ids=["issue", "101", "range-101", "open-500", "nested", "total", "hex-escape",
        "unicode-brace", "octal"])
def test_regex_repetition_far_beyond_real_use_is_refused_before_parsing(query: str) -> None:
    with pytest.raises(LimitExceeded):
        check_regex_repetition(query)


@pytest.mark.parametrize("query", [
    'slurm_job_info{jobid=~"\\\\d{1,10}"}',
    'x{a=~"(ab){3}c{100}"}',
    'sum by (user) (rate(slurm_job_gpu_busy{user="alice"}[5m]))',
    'x{a=~"[a-z]{2,8}"} or y{b=~"\\\\d{4}-\\\\d{2}"}',
])
def test_ordinary_counts_pass(query: str) -> None:
    check_regex_repetition(query)


def test_nested_counts_multiply_and_siblings_add() -> None:
    assert repetition_weight('"(a{2}){3}"') == 3 * (1 + 2)
    assert repetition_weight('"(ab){3}c{2}"') == 5
    assert repetition_weight('"((a{10}){10}){10}"') == 10 * (1 + 10 * (1 + 10))
    assert repetition_weight("sum(rate(x[5m]))") == 0


def test_every_dashboard_query_passes_the_repetition_bound() -> None:
    boards = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
    exprs = [t.expr for board in boards for t in grafana.targets(grafana.load(board))]
    assert len(exprs) > 20
    for expr in exprs:
        check_regex_repetition(expr)
