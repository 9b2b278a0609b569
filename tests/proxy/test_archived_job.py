"""``GET /slurm-gpu/v1/jobs/<jobid>`` in process, on mocked requests over a stand-in
archive: who may see which archived job, every refusal, what is counted; the JSON error
answer every refusal of the proxy gets; and the archive reader on a fresh SQLite file."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from slurm_gpu_exporter.proxy.app import archived_job, not_found, own_metrics, refuse
from slurm_gpu_exporter.proxy.archive import (
    ArchivedJob,
    ArchiveReader,
    ArchiveSetupError,
    ArchiveUnavailable,
)
from slurm_gpu_exporter.proxy.observe import ProxyMetrics
from slurm_gpu_exporter.proxy.query.restrict import Scope
from slurm_gpu_exporter.proxy.state import SCOPE, STATE, Refused

ALICE = Scope(admin=False, users=frozenset({"alice"}))
COORDINATOR = Scope(admin=False, users=frozenset({"carol", "dave"}))
ADMIN = Scope(admin=True)
JOBS = [ArchivedJob("alice", "east", 100.0, {"usage": {"jobid": "7"}}),
        ArchivedJob("dave", "west", 200.0, {"usage": {"jobid": "7"}})]


@dataclass
class Archive:
    found: list[ArchivedJob] = field(default_factory=lambda: list(JOBS))
    busy: bool = False
    fail: bool = False
    asked: list[tuple[str, str | None]] = field(default_factory=list)

    async def job(self, jobid: str, cluster: str | None) -> list[ArchivedJob]:
        self.asked.append((jobid, cluster))
        if self.fail:
            raise ArchiveUnavailable("database is locked")
        return [j for j in self.found if cluster is None or j.cluster == cluster]


@dataclass
class State:
    archive: Archive | None = field(default_factory=Archive)
    metrics: ProxyMetrics = field(default_factory=ProxyMetrics)


def app_of(state: State) -> web.Application:
    app = web.Application()
    app[STATE] = state  # type: ignore[assignment]
    return app


def get(state: State, jobid: str, query: str = "", scope: Scope = ALICE,
        method: str = "GET") -> dict:
    request = make_mocked_request(method, f"/slurm-gpu/v1/jobs/{jobid}{query}",
                                  app=app_of(state), match_info={"jobid": jobid})
    request[SCOPE] = scope
    response = asyncio.run(archived_job(request))
    return json.loads(response.text)  # type: ignore[attr-defined]


def refused(state: State, jobid: str, query: str = "", scope: Scope = ALICE,
            method: str = "GET") -> tuple[int, str, str]:
    with pytest.raises(Refused) as caught:
        get(state, jobid, query, scope, method)
    return caught.value.status, caught.value.reason, caught.value.message


def sample(state: State, name: str, **labels: str) -> float | None:
    return state.metrics.registry.get_sample_value(name, labels)


def test_a_user_sees_their_own_archived_job_and_only_theirs() -> None:
    state = State()
    assert get(state, "7") == {"status": "success", "data": {"jobs": [
        {"cluster": "east", "user": "alice", "archived_at": 100.0,
         "detail": {"usage": {"jobid": "7"}}}]}}
    assert state.archive.asked == [("7", None)]  # type: ignore[union-attr]
    assert sample(state, "slurm_gpu_proxy_requests_total", endpoint="archive_job",
                  code="200") == 1.0
    assert sample(state, "slurm_gpu_proxy_upstream_duration_seconds_count",
                  endpoint="archive_job") == 1.0


def test_a_coordinator_and_an_admin_see_the_jobs_of_their_users() -> None:
    assert [j["user"] for j in get(State(), "7", scope=COORDINATOR)["data"]["jobs"]] == [
        "dave"]
    assert [j["cluster"] for j in get(State(), "7", scope=ADMIN)["data"]["jobs"]] == [
        "east", "west"]


def test_one_cluster_is_asked_for_by_name() -> None:
    state = State()
    assert get(state, "7", "?cluster=west", scope=ADMIN)["data"]["jobs"][0]["user"] == "dave"
    assert state.archive.asked == [("7", "west")]  # type: ignore[union-attr]


def test_another_users_job_is_403_and_a_missing_one_404() -> None:
    assert refused(State(), "7", scope=Scope(admin=False, users=frozenset({"bob"}))) == (
        403, "not_yours", "job 7 is not yours: the proxy shows each user only their own "
        "jobs; ask the job's owner or an admin")
    assert refused(State(archive=Archive(found=[])), "8") == (
        404, "not_archived", "job 8 is not in the job archive; check the id (a job is "
        "archived once it has ended)")


@pytest.mark.parametrize(("jobid", "query", "method", "expected"), [
    ("7", "", "POST", (405, "method", "/slurm-gpu/v1/jobs/7 takes GET only")),
    ("07", "", "GET", (400, "bad_jobid", "a job id is digits, with _TASK or +COMPONENT at "
                                         "most (e.g. 12345, 12345_7)")),
    ("7;DROP", "", "GET", (400, "bad_jobid", "a job id is digits, with _TASK or +COMPONENT "
                                             "at most (e.g. 12345, 12345_7)")),
    ("7", "?user=bob", "GET", (400, "bad_request", "the only parameter is one cluster=NAME")),
    ("7", "?cluster=a&cluster=b", "GET",
     (400, "bad_request", "the only parameter is one cluster=NAME")),
    ("7", "?cluster=-x", "GET",
     (400, "bad_request", "cluster must be a cluster name (letters, digits, ._-)")),
])
def test_bad_requests_are_refused_before_the_archive(
        jobid: str, query: str, method: str, expected: tuple[int, str, str]) -> None:
    state = State()
    assert refused(state, jobid, query, method=method) == expected
    assert state.archive.asked == []  # type: ignore[union-attr]


def test_array_tasks_and_het_components_are_job_ids() -> None:
    for jobid in ("7_3", "7+1", "123456789012"):
        state = State(archive=Archive(found=[ArchivedJob("alice", "", 1.0, {})]))
        assert get(state, jobid)["status"] == "success"


def test_no_archive_a_busy_one_and_a_failing_one() -> None:
    assert refused(State(archive=None), "7") == (
        404, "no_archive", "this proxy serves no job archive; its admins can start it with "
        "--archive.url")
    assert refused(State(archive=Archive(busy=True)), "7") == (
        503, "busy", "the proxy is reading the archive for too many requests; retry in 1 s")
    state = State(archive=Archive(fail=True))
    assert refused(state, "7") == (
        503, "archive_unavailable", "the job archive behind this proxy cannot be read now; "
        "try again, or tell its admins")
    assert sample(state, "slurm_gpu_proxy_upstream_errors_total",
                  endpoint="archive_job") == 1.0


def test_other_slurm_gpu_paths_are_404() -> None:
    request = make_mocked_request("GET", "/slurm-gpu/v2/x", app=app_of(State()))
    with pytest.raises(Refused) as caught:
        asyncio.run(not_found(request))
    assert (caught.value.status, caught.value.reason, caught.value.message) == (
        404, "not_found", "no such endpoint /slurm-gpu/v2/x; the archive's is "
        "/slurm-gpu/v1/jobs/<jobid>")


def test_the_own_metrics_endpoint_serves_the_exposition() -> None:
    state = State()
    state.metrics.connections_refused.inc()
    response = asyncio.run(own_metrics(make_mocked_request("GET", "/metrics",
                                                           app=app_of(state))))
    assert response.content_type == "text/plain" and response.charset == "utf-8"
    assert b"slurm_gpu_proxy_connections_refused_total 1.0" in response.body  # type: ignore


def test_a_refusal_is_a_prometheus_style_error_counted_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    state = State()
    request = make_mocked_request("GET", "/api/v1/query", app=app_of(state))
    with caplog.at_level(logging.WARNING):
        answer = refuse(request, 401, "bad_credentials", "wrong user name or password", "",
                        "auth")
    assert answer.status == 401
    assert json.loads(answer.text) == {"status": "error", "errorType": "bad_credentials",
                                       "error": "wrong user name or password"}
    assert answer.headers["WWW-Authenticate"] == 'Basic realm="slurm-gpu-proxy"'
    assert "Retry-After" not in answer.headers
    assert caplog.messages == ["refused GET '/api/v1/query' for user '-': bad_credentials "
                               "(wrong user name or password)"]
    assert sample(state, "slurm_gpu_proxy_refusals_total", reason="bad_credentials") == 1.0
    assert sample(state, "slurm_gpu_proxy_requests_total", endpoint="auth", code="401") == 1.0
    busy = refuse(request, 503, "busy", "wait", "alice", "query", retry_after=7)
    assert busy.headers["Retry-After"] == "7" and "WWW-Authenticate" not in busy.headers
    assert caplog.messages[-1] == "refused GET '/api/v1/query' for user 'alice': busy (wait)"
    assert refuse(request, 429, "backoff", "wait", "alice", "query").headers[
        "Retry-After"] == "1"
    assert "Retry-After" not in refuse(request, 400, "limit", "x", "alice", "query").headers


def test_the_archive_reader_names_the_flag_of_a_bad_url() -> None:
    with pytest.raises(ArchiveSetupError) as caught:
        ArchiveReader("mysql://db/archive")
    assert "--archive.url" in str(caught.value) and "--db" not in str(caught.value)


def test_the_archive_reader_on_a_fresh_archive_finds_no_job(tmp_path: Path) -> None:
    from slurm_gpu_exporter.report.archive.store import ArchiveStore

    url = f"sqlite:///{tmp_path}/archive.db"
    reader = ArchiveReader(url, timeout_s=2.5)
    assert (reader.url, reader.timeout_s, reader.busy) == (url, 2.5, False)
    assert str(tmp_path) in reader.where
    with ArchiveStore(url, write=True):
        pass  # made, with its tables
    assert reader.check() is None
    assert asyncio.run(reader.job("7", None)) == []
    assert reader.busy is False  # the read is done: nothing counted as in flight
