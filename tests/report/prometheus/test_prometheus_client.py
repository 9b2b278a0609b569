"""The report's Prometheus client: a bounded number of queries in flight, and busy
answers (503, 429, the proxy's ``auth_busy``) tried again a bounded number of times
after the server's Retry-After, then one clear error."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.detail_data import detail_to_data
from slurm_gpu_exporter.report.figures.shapes import Accounting, JobDetail, JobUsage
from slurm_gpu_exporter.report.prometheus.archived import ProxyArchive, archived_jobs
from slurm_gpu_exporter.report.prometheus.client import (
    EXIT_QUERY,
    Connection,
    PrometheusClient,
    gather,
)
from slurm_gpu_exporter.report.prometheus.retry import RetryPolicy, retry_after_seconds
from tests.support import wait_until

Handler = Callable[[web.Request], Awaitable[web.Response]]
EMPTY = {"status": "success", "data": {"resultType": "vector", "result": []}}
REPORT = Path(sys.executable).parent / "slurm-gpu-report"


def test_pauses_grow_from_half_a_second_and_are_capped() -> None:
    policy = RetryPolicy(retries=6, first_pause_s=0.5, max_pause_s=3.0)
    assert [policy.pause(n, None, 0.0) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_retry_after_in_seconds_or_as_a_date_wins_up_to_the_cap() -> None:
    policy = RetryPolicy(max_pause_s=30.0)
    now = 1_780_000_000.0  # Thu, 28 May 2026 20:26:40 GMT
    assert policy.pause(1, "7", now) == 7.0
    assert policy.pause(1, "Thu, 28 May 2026 20:26:50 GMT", now) == 10.0
    assert policy.pause(1, "3600", now) == 30.0
    assert retry_after_seconds("Thu, 28 May 2026 20:26:00 GMT", now) == 0.0  # past
    for odd in ("soon", "-1", "1.5", "", None):
        assert retry_after_seconds(odd, now) is None
        assert policy.pause(2, odd, now) == 1.0  # the client's own pause


async def _serve(handler: Handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/api/v1/query", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


def _client(url: str, pauses: list[float], **conn: object) -> PrometheusClient:
    async def sleep(seconds: float) -> None:
        pauses.append(seconds)

    return PrometheusClient(Connection(url, timeout_s=10, **conn), sleep=sleep)  # type: ignore[arg-type]


def test_no_more_queries_in_flight_than_the_cap() -> None:
    async def scenario() -> tuple[int, int]:
        in_flight, most = 0, 0
        full = asyncio.Event()

        async def handler(request: web.Request) -> web.Response:
            nonlocal in_flight, most
            in_flight += 1
            most = max(most, in_flight)
            if in_flight == 3:
                full.set()
            try:  # hold each answer until the cap is reached (or a while has passed)
                await asyncio.wait_for(full.wait(), 5)
            except TimeoutError:
                pass
            in_flight -= 1
            return web.json_response(EMPTY)

        runner, url = await _serve(handler)
        try:
            async with _client(url, [], max_concurrent=3) as prom:
                await gather(*(prom.instant("up", 0.0) for _ in range(12)))
                assert prom.queries == 12
                return most, prom.most_in_flight
        finally:
            await runner.cleanup()

    assert asyncio.run(scenario()) == (3, 3)


def _busy_then_ok(refusals: list[web.Response]) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return refusals.pop(0) if refusals else web.json_response(EMPTY)
    return handler


def _run_query(handler: Handler, pauses: list[float], **conn: object) -> PrometheusClient:
    async def scenario() -> PrometheusClient:
        runner, url = await _serve(handler)
        try:
            async with _client(url, pauses, **conn) as prom:
                await prom.instant("up", 0.0)
                return prom
        finally:
            await runner.cleanup()
    return asyncio.run(scenario())


def test_busy_answers_are_tried_again_after_their_retry_after() -> None:
    pauses: list[float] = []
    proxy_busy = web.json_response(
        {"status": "error", "errorType": "auth_busy", "error": "too many password checks"},
        status=503, headers={"Retry-After": "2"})
    store_busy = web.Response(status=503, text="cannot handle more than 4 concurrent "
                                               "search requests", headers={"Retry-After": "5"})
    gateway = web.Response(status=429, text="slow down")
    prom = _run_query(_busy_then_ok([proxy_busy, store_busy, gateway]), pauses)
    assert pauses == [2.0, 5.0, 2.0]  # the third: no header, the client's third pause
    assert prom.busy_answers == 3 and prom.queries == 1


def test_a_server_busy_at_every_try_is_one_clear_error() -> None:
    pauses: list[float] = []

    async def always_busy(request: web.Request) -> web.Response:
        return web.json_response({"status": "error", "errorType": "auth_busy",
                                  "error": "too many password checks at once"}, status=503)

    with pytest.raises(ReportError) as raised:
        _run_query(always_busy, pauses, retry=RetryPolicy(retries=2))
    assert pauses == [0.5, 1.0]
    message = str(raised.value)
    assert raised.value.exit_code == EXIT_QUERY and "\n" not in message
    for words in ("busy (HTTP 503: too many password checks at once)", "each of 3 tries",
                  "--max-concurrent-queries"):
        assert words in message, message


def test_other_errors_and_no_retries_answer_at_once() -> None:
    pauses: list[float] = []

    async def bad_query(request: web.Request) -> web.Response:
        return web.json_response({"status": "error", "errorType": "bad_data",
                                  "error": "parse error"}, status=400)

    with pytest.raises(ReportError, match="bad_data: parse error"):
        _run_query(bad_query, pauses)
    with pytest.raises(ReportError, match="HTTP 503 without an API response"):
        _run_query(_busy_then_ok([web.Response(status=503, text="busy")]), pauses,
                   retry=RetryPolicy(retries=0))
    assert pauses == []


def test_every_try_signs_in_with_a_fresh_munge_credential() -> None:
    seen: list[str] = []
    answers = [web.Response(status=503, headers={"Retry-After": "0"}, text="busy")
               for _ in range(2)]

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers["Authorization"])
        return await _busy_then_ok(answers)(request)

    count = iter(range(100))
    _run_query(handler, [], munge_credential=lambda: f"cred{next(count)}")
    assert seen == ["Munge cred0", "Munge cred1", "Munge cred2"]


def _ask_archive(handler: Handler, jobids: list[str], **conn: object
                 ) -> tuple[ProxyArchive, PrometheusClient]:
    """What ``archived_jobs`` made of a proxy that answers with ``handler``, asked
    through the queries' own client."""
    async def scenario() -> tuple[ProxyArchive, PrometheusClient]:
        app = web.Application()
        app.router.add_get("/prefix/slurm-gpu/v1/jobs/{jobid}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/prefix/"
        try:
            async with _client(url, [], **conn) as prom:
                return await archived_jobs(prom, jobids, "c1"), prom
        finally:
            await runner.cleanup()
    return asyncio.run(scenario())


def test_the_proxys_archive_is_asked_through_the_queries_client() -> None:
    # Signed in as the queries are, a fresh munge credential for each job (the basic
    # auth of the connection under it), and not counted as a query.
    detail = JobDetail(usage=JobUsage(jobid="12", user="alice", gpus=1, allocated_s=10.0,
                                      busy_s=5.0, start=1.0, end=11.0),
                       nodes=[], accounting=Accounting(), now=11.0)
    seen: list[tuple[str, str, str]] = []

    async def handler(request: web.Request) -> web.Response:
        jobid = request.match_info["jobid"]
        seen.append((jobid, request.headers["Authorization"], request.query["cluster"]))
        if jobid == "12":
            return web.json_response({"status": "success", "data": {"jobs": [
                {"cluster": "c1", "user": "alice", "archived_at": 20.0,
                 "detail": detail_to_data(detail)}]}})
        if jobid == "13_4":
            return web.json_response({"status": "error", "errorType": "not_yours",
                                      "error": "job 13_4 is not yours"}, status=403)
        return web.json_response({"status": "error", "errorType": "not_archived",
                                  "error": "not archived"}, status=404)

    count = iter(range(100))
    asked, prom = _ask_archive(handler, ["12", "13_4", "14"], username="u", password="p",
                               munge_credential=lambda: f"cred{next(count)}")
    assert seen == [("12", "Munge cred0", "c1"), ("13_4", "Munge cred1", "c1"),
                    ("14", "Munge cred2", "c1")]
    assert asked.found == {"12": [(detail, 20.0)]} and asked.problem is None
    assert asked.not_yours == {"13_4": "job 13_4 is not yours"}
    assert prom.queries == 0
    basic: list[str] = []

    async def plain(request: web.Request) -> web.Response:
        basic.append(request.headers["Authorization"])
        return web.json_response({"status": "error", "errorType": "not_archived",
                                  "error": "not archived"}, status=404)

    _ask_archive(plain, ["15"], username="u", password="p")
    assert basic == ["Basic dTpw"]


def test_a_server_without_the_archive_endpoint_is_asked_once() -> None:
    asked_for: list[str] = []

    async def prometheus(request: web.Request) -> web.Response:
        asked_for.append(request.match_info["jobid"])
        return web.Response(status=404, text="404 page not found")

    asked, _ = _ask_archive(prometheus, ["12", "13"])
    assert asked_for == ["12"] and asked.found == {} and asked.problem is None


@pytest.fixture
def busy_server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """The stand-alone server, busy for its first ``request.param`` answers."""
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, "-m", "tests.report.prometheus.busy_server",
                             "--port-file", str(port_file), "--busy", str(request.param)])
    try:
        wait_until(lambda: port_file.exists() or proc.poll() is not None, 30,
                   "the busy server to listen", poll=0.1)
        assert proc.poll() is None
        yield f"http://127.0.0.1:{port_file.read_text()}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.process
@pytest.mark.parametrize("busy_server", [3], indirect=True)
def test_the_report_rides_out_a_busy_server_process(busy_server: str) -> None:
    """The command against a real server process: 503 twice (proxy, store) and a 429,
    then answers; the report succeeds after those tries."""
    run = subprocess.run([str(REPORT), "low-util", "--since", "1h", "--format", "json",
                          "--prometheus-url", busy_server, "--max-concurrent-queries", "2"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert '"jobs_seen": 0' in run.stdout
    with urllib.request.urlopen(busy_server + "/count", timeout=10) as resp:
        counts = resp.read().decode()
    assert '"busy": 3' in counts


@pytest.mark.process
@pytest.mark.parametrize("busy_server", [1000], indirect=True)
def test_the_report_gives_up_on_a_server_busy_for_longer(busy_server: str) -> None:
    run = subprocess.run([str(REPORT), "low-util", "--since", "1h", "--prometheus-url",
                          busy_server, "--retries", "1", "--max-concurrent-queries", "1"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == EXIT_QUERY
    assert run.stderr.count("\n") == 1 and "was busy (HTTP " in run.stderr, run.stderr
