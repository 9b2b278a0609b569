"""What the proxy says when it refuses, in process: request parameters from the URL and a
POST form (not UTF-8, the wrong body type, a body that never comes), munge's refusals
that need no munged, the regex bounds' messages, and the readiness probe against a store
on a loopback port and one that is down."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
from aiohttp import streams, web
from aiohttp.test_utils import TestServer, make_mocked_request
from yarl import URL

from slurm_gpu_exporter.proxy import munge as munge_module
from slurm_gpu_exporter.proxy.app import ready
from slurm_gpu_exporter.proxy.fairness import FairLimits
from slurm_gpu_exporter.proxy.munge import MungeDecoder, MungeRefusal, _refusal
from slurm_gpu_exporter.proxy.observe import ProxyMetrics
from slurm_gpu_exporter.proxy.params import BadRequest, read_params
from slurm_gpu_exporter.proxy.query.limits import LimitExceeded, check_regex_repetition
from slurm_gpu_exporter.proxy.state import STATE
from slurm_gpu_exporter.proxy.upstream import Upstream

FORM = "application/x-www-form-urlencoded"


def _post(path: str, body: bytes | None, content_type: str = FORM) -> object:
    """read_params of a POST with ``body`` (None: a body that never arrives)."""
    async def run() -> object:
        reader = streams.StreamReader(mock.Mock(_reading_paused=False), 2**16,
                                      loop=asyncio.get_running_loop())
        if body is not None:
            reader.feed_data(body)
            reader.feed_eof()
        request = make_mocked_request(
            "POST", path, payload=reader,
            headers={"Content-Type": content_type, "Content-Length": str(len(body or b"x"))})
        try:
            async with asyncio.timeout(0.2):
                return await read_params(request)
        except (BadRequest, TimeoutError) as exc:
            return exc
    return asyncio.run(run())


def test_url_and_form_parameters_are_read_in_that_order() -> None:
    params = _post("/api/v1/query?time=1", b"query=up&time=2")
    assert list(params.items()) == [("time", "1"), ("query", "up"), ("time", "2")]  # type: ignore


def test_a_post_body_of_another_type_is_refused() -> None:
    got = _post("/api/v1/query", b"{}", "application/json")
    assert isinstance(got, BadRequest)
    assert str(got) == ("a POST body must be application/x-www-form-urlencoded, not "
                        "'application/json'")


def test_a_form_body_that_is_not_utf8_is_refused() -> None:
    got = _post("/api/v1/query", b"query=\xff")
    assert isinstance(got, BadRequest)
    assert str(got) == ("the form body is not UTF-8 text; percent-encode every parameter's "
                        "UTF-8 bytes")


def test_a_body_that_never_comes_is_waited_for_no_longer_than_the_caller_says() -> None:
    assert isinstance(_post("/api/v1/query", None), TimeoutError)


def test_munges_codes_are_told_apart() -> None:
    assert _refusal(15) == MungeRefusal(401, "munge_expired", "the munge credential has "
                                        "expired; make a fresh one")
    assert _refusal(6) == MungeRefusal(503, "munge_unavailable", "munged did not answer")
    assert _refusal(99) == MungeRefusal(401, "munge_invalid", "the munge credential is not "
                                        "valid here (forged, damaged or another site's key)")


def test_a_malformed_credential_is_refused_without_asking_munged() -> None:
    decoder = MungeDecoder(Path("/run/m.sock"), unmunge="/nonexistent/unmunge")
    assert asyncio.run(decoder.decode("not-a-credential")) == MungeRefusal(
        401, "munge_malformed", "the Authorization header must be 'Munge ' and one "
        "credential as `munge` prints it")


def test_without_unmunge_the_decoder_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(munge_module.shutil, "which", lambda name: None)
    with pytest.raises(FileNotFoundError) as caught:
        MungeDecoder(Path("/run/m.sock"))
    assert str(caught.value) == ("unmunge not found; install munge (Debian: apt-get install "
                                 "munge)")


# (x{50}){6}: six times one plus the fifty the group holds
@pytest.mark.parametrize(("text", "message"), [
    ('up{a=~"(x{50}){6}"}', "query's regex repetition counts add up to 306 (nested ones "
                            "multiply), more than the 250 allowed; use + or * instead"),
    ('up{a=~"\\\\x31"}', "query writes a digit, comma or brace as the escape \\x31; write "
                          "the character itself"),
])
def test_regex_bounds_say_what_to_write_instead(text: str, message: str) -> None:
    with pytest.raises(LimitExceeded) as caught:
        check_regex_repetition(text)
    assert str(caught.value) == message


def _ready(url: str) -> web.Response:
    async def run() -> web.Response:
        app = web.Application()
        async def query(request: web.Request) -> web.Response:
            return web.json_response({"status": "success"})

        app.router.add_get("/prom/api/v1/query", query)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        base = url or str(server.make_url("/prom/"))
        upstream = Upstream(base, 5.0, FairLimits(), ProxyMetrics())
        await upstream.start()
        state = SimpleNamespace(upstream=URL(base), upstream_calls=upstream,
                                config=SimpleNamespace(prometheus_url=base))
        proxy = web.Application()
        proxy[STATE] = state  # type: ignore[assignment]
        try:
            return await ready(make_mocked_request("GET", "/-/ready", app=proxy))
        finally:
            await upstream.close()
            await server.close()
    return asyncio.run(run())


def test_ready_while_the_store_answers_a_query() -> None:
    answer = _ready("")
    assert (answer.status, answer.text) == (200, "Ready\n")


def test_not_ready_while_the_store_is_down() -> None:
    answer = _ready("http://127.0.0.1:9/")
    assert answer.status == 503
    assert answer.text == ("upstream http://127.0.0.1:9/ not reachable (ClientConnectorError);"
                           " check --prometheus-url\n")
