"""``slurm-gpu-proxy``'s serve step in process, with the listener and the signals
replaced: what it hands the listener, what it logs at start (the archive, munge, the
file limit, each address) and its exit status when it cannot listen. The printed form of
a comparison with ``bool`` sent upstream."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from slurm_gpu_exporter.proxy import cli
from slurm_gpu_exporter.proxy import munge as munge_module
from slurm_gpu_exporter.proxy.config import ProxyConfig
from slurm_gpu_exporter.proxy.fairness import FairLimits
from slurm_gpu_exporter.proxy.query.check_worker import answer
from slurm_gpu_exporter.proxy.state import STATE
from slurm_gpu_exporter.web.config import WebConfig
from slurm_gpu_exporter.web.listen import Bound, ListenError

CONFIG = ProxyConfig("http://store:9090")


class Runner:
    cleaned = False

    async def cleanup(self) -> None:
        self.cleaned = True


@pytest.fixture
def listener(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """cli.start and cli.stop_signals replaced: what start was given, and a stop at once."""
    seen: dict[str, Any] = {"runner": Runner()}

    async def start(app: web.Application, addresses: list[str], ssl: object,
                    **kwargs: Any) -> Runner:
        if seen.get("fail"):
            raise seen["fail"]
        seen.update(app=app, addresses=addresses, ssl=ssl, **kwargs)
        kwargs["announce"](Bound(addresses[0], "127.0.0.1", 9818, False))
        kwargs["announce"](Bound(":9819", None, 9819, True))
        return seen["runner"]

    @contextlib.asynccontextmanager
    async def stop_signals() -> AsyncIterator[asyncio.Event]:
        stop = asyncio.Event()
        stop.set()
        yield stop

    monkeypatch.setattr(cli, "start", start)
    monkeypatch.setattr(cli, "stop_signals", stop_signals)
    return seen


class Archive:
    where = "sqlite:///srv/archive.db"

    def __init__(self, problem: str | None) -> None:
        self.problem = problem

    def check(self) -> str | None:
        return self.problem


def serve(**kwargs: Any) -> int:
    return asyncio.run(cli.serve(CONFIG, WebConfig(), ["127.0.0.1:9818"], **kwargs))


def test_serve_listens_announces_each_address_and_stops_on_a_signal(
        listener: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="slurm_gpu_exporter.proxy"):
        assert serve(max_connections=64) == 0
    assert listener["addresses"] == ["127.0.0.1:9818"] and listener["ssl"] is None
    assert (listener["backlog"], listener["lingering_time"]) == (512, 2.0)
    assert isinstance(listener["app"], web.Application)
    assert listener["runner"].cleaned
    assert "listening on 127.0.0.1:9818 (http), forwarding to http://store:9090" in \
        caplog.messages
    assert "listening on :9819 (https), forwarding to http://store:9090" in caplog.messages


def test_serve_says_whether_it_can_read_the_archive(
        listener: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="slurm_gpu_exporter.proxy"):
        serve(archive=Archive("no such table: jobs"))
        archive = Archive(None)
        serve(archive=archive)
    assert listener["app"][STATE].archive is archive  # served even before it can be read
    assert "the job archive cannot be read yet: no such table: jobs" in caplog.messages
    assert "serving archived jobs from sqlite:///srv/archive.db" in caplog.messages


def test_serve_names_the_munge_audiences_it_takes(
        listener: dict[str, Any], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(munge_module.shutil, "which", lambda name: f"/usr/bin/{name}")
    with caplog.at_level(logging.INFO, logger="slurm_gpu_exporter.proxy"):
        serve(munge_socket=Path("/run/m.sock"),
              audiences=frozenset({"https://b.example:1", "https://a.example:1"}))
    assert ("taking munge credentials made for https://a.example:1, https://b.example:1"
            in caplog.messages)
    decoder = listener["app"][STATE].munge
    assert decoder.socket == Path("/run/m.sock")
    assert decoder.audiences == {"https://a.example:1", "https://b.example:1"}


def test_serve_hands_the_app_its_limits_and_no_munge_without_a_socket(
        listener: dict[str, Any]) -> None:
    serve(limits=FairLimits(checks_per_user=3))
    state = listener["app"][STATE]
    assert state.munge is None and state.check_share.limit == 3


def test_serve_warns_when_the_file_limit_leaves_fewer_connections(
        listener: dict[str, Any], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "connection_cap", lambda wanted: 100)
    with caplog.at_level(logging.WARNING, logger="slurm_gpu_exporter.proxy"):
        serve(max_connections=1024)
    assert caplog.messages == ["the file limit leaves room for 100 connections, not 1024; "
                               "raise LimitNOFILE"]


def test_serve_fails_with_1_when_it_cannot_listen(
        listener: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    listener["fail"] = ListenError("cannot listen on 127.0.0.1:9818: address in use")
    with caplog.at_level(logging.ERROR, logger="slurm_gpu_exporter.proxy"):
        assert serve() == 1
    assert caplog.messages == ["cannot listen on 127.0.0.1:9818: address in use; pick a free "
                               "address"]
    listener["fail"] = OSError("[Errno 2] No such file: python")
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="slurm_gpu_exporter.proxy"):
        assert serve() == 1
    assert caplog.messages[0].startswith("[Errno 2] No such file: python; check that "
                                         "slurm-gpu-exporter is installed for ")


def test_a_comparison_with_bool_is_printed_as_written() -> None:
    reply = answer({"kind": "query", "text": "up > bool 1", "admin": False,
                    "users": ["alice"], "public": []})
    assert reply == {"text": '{__name__="up",user="alice"} > bool 1.0'}
