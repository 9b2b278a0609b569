"""Smaller rules of the proxy, each on values worked out by hand: how vector matching,
infinities and @ are printed upstream, the nesting bound at its edge, a scope with no
user, the config's messages, a second --public-metric, a selector that is a query,
the password-check flood and a web config read by main."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import bcrypt
import pytest
from aiohttp.test_utils import make_mocked_request

from slurm_gpu_exporter.proxy import cli
from slurm_gpu_exporter.proxy.api import UPSTREAM_GET_BYTES
from slurm_gpu_exporter.proxy.cli import build_parser, main
from slurm_gpu_exporter.proxy.config import ConfigError, load_config, parse_config
from slurm_gpu_exporter.proxy.identity import Refusal, identify
from slurm_gpu_exporter.proxy.query.check_worker import answer
from slurm_gpu_exporter.proxy.query.restrict import QueryRefused, Scope, restrict_query
from slurm_gpu_exporter.web.basic_auth import AuthBusy, BasicAuth
from slurm_gpu_exporter.web.config import WebConfig
from tests.proxy.test_read_endpoints import State, ask, refused, sent

U = Scope(admin=False, users=frozenset({"u"}))


def printed(query: str) -> str:
    return answer({"kind": "query", "text": query, "admin": False, "users": ["u"],
                   "public": []})["text"]


def test_vector_matching_infinities_and_at_are_printed_as_prometheus_reads_them() -> None:
    a, b = '{__name__="a",user="u"}', '{__name__="b",user="u"}'
    assert printed("a + ignoring(job) b") == f"{a} + ignoring (job) {b}"
    assert printed("a / on(x) group_right(y) b") == f"{a} / on (x) group_right (y) {b}"
    assert printed("a / on(x) group_left b") == f"{a} / on (x) group_left () {b}"
    assert printed("up > Inf") == '{__name__="up",user="u"} > Inf'
    assert printed("up > -Inf") == '{__name__="up",user="u"} > -Inf'
    assert printed("up @ start()") == '{__name__="up",user="u"} @ start()'


def test_the_nesting_bound_lets_200_levels_through_and_no_more() -> None:
    text = restrict_query("(" * 199 + "up" + ")" * 199, U)  # 199 brackets + the selector
    assert text.count('user="u"') == 1
    with pytest.raises(QueryRefused) as caught:
        restrict_query("(" * 200 + "up" + ")" * 200, U)
    assert str(caught.value) == "query nests deeper than 200 levels; flatten it"


def test_a_scope_without_users_matches_no_series() -> None:
    assert Scope(admin=False).user_matcher().value == "$^"
    assert printed("up").endswith('user="u"}')


def test_the_configs_messages_name_the_key(tmp_path: Path) -> None:
    cases: list[tuple[Any, str]] = [
        ({"zeta": 1, "alpha": 2}, "proxy config: unknown key(s) alpha, zeta"),
        ({"admins": ["ok", "not ok"]}, "admins: 'not ok' is not a user name (letters, "
                                       "digits, ._@+-)"),
        ({"public_metrics": "a:b"}, "public_metrics must be a list of names"),
    ]
    for data, message in cases:
        with pytest.raises(ConfigError) as caught:
            parse_config(data, tmp_path)
        assert str(caught.value) == message
    with pytest.raises(ConfigError) as caught:
        load_config(None, "ftp://store", [], [])
    assert str(caught.value) == "--prometheus-url 'ftp://store' must start with http:// or https://"
    assert load_config(None, "https://store/prom/", ["root"], ["a:b"]).prometheus_url == (
        "https://store/prom")


def test_public_metrics_given_twice_add_up() -> None:
    args = build_parser().parse_args(["--public-metric", "a", "b", "--public-metric", "c"])
    assert args.public_metric == ["a", "b", "c"]


def test_a_match_that_is_no_selector_is_refused() -> None:
    error = refused(State(), "/api/v1/series?match[]=sum(up)")
    assert (error.status, error.reason, error.message) == (
        400, "bad_query", "match[] 'sum(up)' is not a series selector")


def test_a_form_of_exactly_the_get_limit_goes_as_a_get() -> None:
    restricted = '{__name__="up",job=~"%s",user="alice"}'
    pad = 0
    while len(urlencode([("query", restricted % ("j" * pad))], quote_via=quote)) < \
            UPSTREAM_GET_BYTES:
        pad += 1
    assert len(urlencode([("query", restricted % ("j" * pad))], quote_via=quote)) == 4096
    state = State()
    ask(state, f'/api/v1/query?query=up{{job=~"{"j" * pad}"}}')
    assert sent(state)[1] == "GET"
    longer = State()
    ask(longer, f'/api/v1/query?query=up{{job=~"{"j" * (pad + 1)}"}}')
    assert sent(longer)[1] == "POST"


def test_a_flood_of_password_checks_is_503(monkeypatch: pytest.MonkeyPatch) -> None:
    async def busy(self: BasicAuth, config: WebConfig, header: str | None) -> bool:
        raise AuthBusy("64 password checks are waiting")

    monkeypatch.setattr(BasicAuth, "check_async", busy)
    request = make_mocked_request("GET", "/api/v1/query",
                                  headers={"Authorization": "Basic YWxpY2U6eA=="})  # alice:x
    got = asyncio.run(identify(request, WebConfig(users={"alice": b"h"}), None,
                               auth=BasicAuth()))
    assert got == Refusal(503, "auth_busy", "too many password checks at once (64 password "
                          "checks are waiting); retry in a second", "alice")


def test_main_reads_the_users_of_the_web_config(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  alice: '{hashed}'\n")
    served: list[tuple] = []

    async def serve(*args: object) -> int:
        served.append(args)
        return 0

    monkeypatch.setattr(cli, "setup_logging", lambda *a, **k: None)
    monkeypatch.setattr(cli, "serve", serve)
    assert main(["--prometheus-url", "http://store:9090", "--web.config.file", str(web)]) == 0
    assert set(served[0][1].users) == {"alice"}
