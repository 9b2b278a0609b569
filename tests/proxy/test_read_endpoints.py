"""The read endpoints in process, on mocked requests: what goes upstream for a user and
for an admin (the path, the checked parameters in a fresh form, GET or POST), and every
way a request is refused. The query checkers are the checker's own ``answer`` run in
process; the store is a stand-in that records each call."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import pytest
from aiohttp import web
from aiohttp.streams import EmptyStreamReader
from aiohttp.test_utils import make_mocked_request
from yarl import URL

from slurm_gpu_exporter.proxy.api import api, endpoint_name, label_values_name
from slurm_gpu_exporter.proxy.fairness import Backoff, Busy, PerUser
from slurm_gpu_exporter.proxy.identity import Caller
from slurm_gpu_exporter.proxy.query.check_pool import CheckBusy
from slurm_gpu_exporter.proxy.query.check_worker import answer
from slurm_gpu_exporter.proxy.query.restrict import QueryRefused, Scope
from slurm_gpu_exporter.proxy.state import CALLER, SCOPE, STATE, Refused

ALICE = Scope(admin=False, users=frozenset({"alice"}), public=frozenset({"a:b"}))
ADMIN = Scope(admin=True)
OWN = '{__name__="up",user="alice"}'


class Checks:
    """check_pool.CheckPool.check, run in process; ``fail`` raises instead."""

    def __init__(self) -> None:
        self.fail: Exception | None = None
        self.asked: list[tuple[str, str]] = []

    async def check(self, kind: str, text: str, scope: Scope) -> str:
        self.asked.append((kind, text))
        if self.fail is not None:
            raise self.fail
        reply = answer({"kind": kind, "text": text, "admin": scope.admin,
                        "users": sorted(scope.users), "public": sorted(scope.public)})
        if "refused" in reply:
            raise QueryRefused(reply["refused"], reason=reply["reason"])
        return reply["text"]


@dataclass
class Store:
    """upstream.Upstream.call: records what would go to the store."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)
    busy: bool = False

    async def call(self, endpoint: str, method: str, url: URL, caller: str, admin: bool,
                   **kwargs: object) -> web.Response:
        if self.busy:
            raise Busy("you have 16 requests at the store", 2)
        self.calls.append((endpoint, method, url, caller, admin, kwargs))
        return web.Response(text="from the store")


@dataclass
class State:
    """The parts of proxy/state.ProxyState the read endpoints use."""

    upstream: URL = field(default_factory=lambda: URL("http://store:9090/prom/"))
    read_timeout: float = 5.0
    checks: Checks = field(default_factory=Checks)
    admin_checks: Checks = field(default_factory=Checks)
    backoff: Backoff = field(default_factory=lambda: Backoff(clock=lambda: 100.0))
    check_share: PerUser = field(default_factory=lambda: PerUser("queries", 1, 4, 1.0))
    upstream_calls: Store = field(default_factory=Store)


def ask(state: State, path: str, scope: Scope = ALICE, method: str = "GET",
        user: str = "alice") -> web.StreamResponse:
    app = web.Application()
    app[STATE] = state  # type: ignore[assignment]
    request = make_mocked_request(method, path, app=app)
    request[SCOPE] = scope
    request[CALLER] = Caller(user, "basic")
    return asyncio.run(api(request))


def refused(state: State, path: str, scope: Scope = ALICE, method: str = "GET") -> Refused:
    with pytest.raises(Refused) as caught:
        ask(state, path, scope, method)
    return caught.value


def sent(state: State) -> tuple[str, str, str, list[tuple[str, str]], str, bool]:
    """The one call to the store: endpoint, method, path, form, caller, admin."""
    [(endpoint, method, url, caller, admin, kwargs)] = state.upstream_calls.calls
    form = parse_qsl(str(kwargs["data"]) if method == "POST" else url.raw_query_string)
    return endpoint, method, url.path, form, caller, admin


def test_a_users_query_goes_up_restricted_with_only_the_known_parameters() -> None:
    state = State()
    ask(state, "/api/v1/query?query=up&time=5&junk=1&timeout=3s")
    assert sent(state) == ("query", "GET", "/prom/api/v1/query",
                           [("time", "5"), ("timeout", "3s"), ("query", OWN)], "alice", False)
    assert state.checks.asked == [("query", "up")] and state.admin_checks.asked == []


def test_a_range_query_keeps_its_range() -> None:
    state = State()
    ask(state, "/api/v1/query_range?query=up&start=1&end=2&step=15&lookback_delta=1m")
    assert sent(state)[:4] == ("query_range", "GET", "/prom/api/v1/query_range", [
        ("start", "1"), ("end", "2"), ("step", "15"), ("lookback_delta", "1m"),
        ("query", OWN)])


def test_an_admins_query_is_checked_by_the_admins_checkers_and_goes_as_written() -> None:
    state = State()
    ask(state, "/api/v1/query?query=sum(up)", ADMIN, user="root")
    assert sent(state) == ("query", "GET", "/prom/api/v1/query", [("query", "sum(up)")],
                           "root", True)
    assert state.admin_checks.asked == [("query", "sum(up)")] and state.checks.asked == []


def test_labels_without_match_are_the_users_own_and_the_public_ones() -> None:
    state = State()
    ask(state, "/api/v1/labels?start=1")
    assert sent(state)[3] == [("start", "1"), ("match[]", '{user="alice"}'),
                              ("match[]", '{__name__="a:b"}')]
    admin = State()
    ask(admin, "/api/v1/labels", ADMIN)
    assert sent(admin)[3] == []


def test_series_need_a_selector_and_each_is_restricted() -> None:
    state = State()
    assert (refused(state, "/api/v1/series").status,
            refused(state, "/api/v1/series").message) == (
        400, "at least one match[] series selector is needed")
    ask(state, "/api/v1/series?match[]=up&match[]=a:b&limit=5")
    assert sent(state)[:4] == ("series", "GET", "/prom/api/v1/series", [
        ("limit", "5"), ("match[]", OWN), ("match[]", '{__name__="a:b"}')])


def test_label_values_of_a_valid_label_name_are_read() -> None:
    state = State()
    ask(state, "/api/v1/label/jobid/values")
    assert sent(state)[:3] == ("label_values", "GET", "/prom/api/v1/label/jobid/values")
    assert label_values_name("/api/v1/label/jobid/values") == "jobid"
    assert label_values_name("/api/v1/label/a-b/values") is None
    assert label_values_name("/api/v1/labels") is None


def test_the_endpoint_label_of_each_path() -> None:
    assert [endpoint_name(p) for p in (
        "/api/v1/query", "/api/v1/query_range", "/api/v1/series", "/api/v1/labels",
        "/api/v1/metadata", "/api/v1/status/buildinfo", "/api/v1/query_exemplars",
        "/api/v1/label/job/values", "/slurm-gpu/v1/jobs/7", "/api/v1/admin/tsdb")] == [
        "query", "query_range", "series", "labels", "metadata", "buildinfo",
        "query_exemplars", "label_values", "archive_job", "other"]


def test_a_long_query_goes_up_as_a_post_form() -> None:
    state = State()
    jobs = "|".join(f"j{i}" for i in range(1000))
    ask(state, f'/api/v1/query?query=up{{job=~"{jobs}"}}')
    endpoint, method, path, form, caller, admin = sent(state)
    assert (endpoint, method, path, caller, admin) == (
        "query", "POST", "/prom/api/v1/query", "alice", False)
    assert form == [("query", f'{{__name__="up",job=~"{jobs}",user="alice"}}')]
    [(_, _, _, _, _, kwargs)] = state.upstream_calls.calls
    assert kwargs["headers"] == {"Content-Type": "application/x-www-form-urlencoded"}


def test_metadata_and_label_values_take_get_only() -> None:
    error = refused(State(), "/api/v1/metadata", method="POST")
    assert (error.status, error.reason, error.message) == (
        405, "method", "/api/v1/metadata takes GET only")
    error = refused(State(), "/api/v1/label/job/values", method="POST")
    assert (error.status, error.reason) == (403, "endpoint")


def test_other_paths_are_for_admins_only() -> None:
    error = refused(State(), "/api/v1/admin/tsdb/snapshot", method="POST")
    assert (error.status, error.reason, error.message) == (
        403, "endpoint", "POST /api/v1/admin/tsdb/snapshot is for admins only; users may "
        "query, query_range, series, labels, label values and metadata")


@pytest.mark.parametrize(("path", "status", "reason", "message"), [
    ("/api/v1/query", 400, "bad_request", "parameter query is missing"),
    ("/api/v1/query?query=up&query=up", 400, "bad_request",
     "parameter query is given 2 times; give it once"),
    ("/api/v1/query?query=info(up)", 400, "function",
     "info() reads series the query does not name; only admins may use it"),
    ("/api/v1/query?query=1" + "%2B1" * 1001, 400, "limit",
     "query has 1001 operators and brackets (comments and strings count too), more than "
     "the 1000 allowed; split it"),
    ('/api/v1/query?query=up{job=~"a{101}"}', 400, "limit",
     "query repeats a regex part 101 times ({101}), more than the 100 allowed; use + or * "
     "instead"),
])
def test_bad_queries_are_refused_before_the_store(path: str, status: int, reason: str,
                                                  message: str) -> None:
    state = State()
    error = refused(state, path)
    assert (error.status, error.reason, error.message) == (status, reason, message)
    assert state.upstream_calls.calls == []


def test_a_query_killed_for_time_makes_the_user_wait_before_the_next() -> None:
    state = State()
    state.checks.fail = QueryRefused("query took longer than 1 s to check", "slow_query")
    error = refused(state, "/api/v1/query?query=up")
    assert (error.status, error.reason, error.message) == (
        400, "slow_query", "query took longer than 1 s to check; your next query is checked "
        "in 1 s at the earliest")
    state.checks.fail = None
    error = refused(state, "/api/v1/query?query=up")
    assert (error.status, error.reason, error.retry_after) == (429, "backoff", 1)
    assert error.message == ("your queries took too long to check 1 times lately; wait 1 s "
                             "and simplify them")
    # other users do not wait
    ask(state, "/api/v1/query?query=up", user="bob",
        scope=Scope(admin=False, users=frozenset({"bob"})))


def test_busy_checkers_and_a_busy_store_share_are_503() -> None:
    state = State()
    state.checks.fail = CheckBusy("no query checker was free for 5 s")
    error = refused(state, "/api/v1/query?query=up")
    assert (error.status, error.reason, error.message) == (
        503, "busy", "the proxy is checking too many queries (no query checker was free for "
        "5 s); retry in 1 s")
    state = State()
    state.upstream_calls.busy = True
    error = refused(state, "/api/v1/query?query=up")
    assert (error.status, error.reason, error.message, error.retry_after) == (
        503, "busy", "you have 16 requests at the store; retry in 2 s", 2)


def test_an_admins_other_request_goes_to_the_store_as_it_came() -> None:
    state = State()
    app = web.Application()
    app[STATE] = state  # type: ignore[assignment]
    request = make_mocked_request("POST", "/api/v1/admin/tsdb/snapshot?skip_head=true",
                                  headers={"Content-Type": "text/plain"}, app=app,
                                  payload=EmptyStreamReader())
    request[SCOPE] = ADMIN
    request[CALLER] = Caller("root", "basic")
    asyncio.run(api(request))
    [(endpoint, method, url, caller, admin, kwargs)] = state.upstream_calls.calls
    assert (endpoint, method, str(url), caller, admin) == (
        "admin_passthrough", "POST",
        "http://store:9090/prom/api/v1/admin/tsdb/snapshot?skip_head=true", "root", True)
    assert kwargs == {"data": b"", "headers": {"Content-Type": "text/plain"}}


class Gate(Checks):
    """Checks that wait for ``opened`` before answering."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = asyncio.Event()
        self.entered = asyncio.Event()

    async def check(self, kind: str, text: str, scope: Scope) -> str:
        self.entered.set()
        await self.opened.wait()
        return await super().check(kind, text, scope)


def test_a_query_that_waited_for_its_share_is_refused_if_the_user_was_struck_meanwhile(
        ) -> None:
    async def run() -> tuple[object, object]:
        state = State(checks=Gate())
        app = web.Application()
        app[STATE] = state  # type: ignore[assignment]

        def request() -> web.Request:
            r = make_mocked_request("GET", "/api/v1/query?query=up", app=app)
            r[SCOPE], r[CALLER] = ALICE, Caller("alice", "basic")
            return r

        first = asyncio.create_task(api(request()))
        await state.checks.entered.wait()  # holds alice's one check slot
        second = asyncio.create_task(api(request()))
        await asyncio.sleep(0.01)  # waits for the slot
        state.backoff.strike("alice")  # another of her queries was killed for time
        state.checks.opened.set()
        return tuple(await asyncio.gather(first, second, return_exceptions=True))

    first, second = asyncio.run(run())
    assert isinstance(first, web.Response)
    assert isinstance(second, Refused) and (second.status, second.reason) == (429, "backoff")
