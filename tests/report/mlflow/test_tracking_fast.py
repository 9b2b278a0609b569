"""The MLflow client (report/mlflow/tracking.py) against an in-process stand-in for the
tracking server's REST API: what each call sends, how it pages, which credentials and
TLS settings it takes from MLflow's own variables, and the one-line error of every
failure. The fast tier's cover of what the process tests (test_mlflow_real.py) check
against a real server."""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.mlflow.tracking import RunNotWritable, TrackingServer
from tests.report.mlflow.standin import Answer, Script, Seen, StandIn, mlflow_stand_in
from tests.report.notify.relay_server import self_signed

RUN = "a" * 32
NO_ENV: dict[str, str] = {}


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _talk(do: Callable[[TrackingServer], Awaitable[Any]], script: Script = lambda s: Answer(),
          environ: Mapping[str, str] = NO_ENV, userinfo: str = "", timeout_s: float = 30.0,
          tls: ssl.SSLContext | None = None) -> tuple[Any, list[Seen], StandIn]:
    """Run ``do`` with a TrackingServer on a fresh stand-in; what it returned, what the
    stand-in saw, and the stand-in."""
    async def go() -> tuple[Any, list[Seen], StandIn]:
        async with mlflow_stand_in(script, tls) as server:
            url = server.url.replace("://", f"://{userinfo}", 1)
            async with TrackingServer(url + "/", timeout_s, environ) as tracking:
                got = await do(tracking)
            return got, server.seen, server
    return asyncio.run(go())


def _fails(do: Callable[[TrackingServer], Awaitable[Any]], script: Script,
           **kwargs: Any) -> tuple[ReportError, StandIn]:
    """The ReportError that ``do`` ends in, and the stand-in it talked to."""

    async def catch(tracking: TrackingServer) -> ReportError:
        try:
            await do(tracking)
        except ReportError as exc:
            return exc
        raise AssertionError("no ReportError")
    exc, _, server = _talk(catch, script, **kwargs)
    return exc, server


def _tag(tracking: TrackingServer) -> Awaitable[None]:
    return tracking.set_tag(RUN, "slurm.figures", "written")


# -- what each call sends -------------------------------------------------------------

def test_a_tag_is_set_with_one_post_naming_the_run_key_and_value() -> None:
    def check(tracking: TrackingServer) -> Awaitable[None]:
        assert tracking.requests == 0
        return _tag(tracking)
    _, seen, _ = _talk(check)
    assert [(s.method, s.body) for s in seen] == [
        ("runs/set-tag", {"run_id": RUN, "key": "slurm.figures", "value": "written"})]


def test_figures_go_in_as_one_batch_at_step_0_with_long_tags_cut() -> None:
    async def write(tracking: TrackingServer) -> int:
        await tracking.log_batch(RUN, {"slurm.gpu_hours": 2.0, "slurm.gpus": 1.0},
                                 {"slurm.user": "alice", "slurm.job": "x" * 6000},
                                 timestamp_ms=1_700_000_000_000)
        return tracking.requests
    requests, seen, _ = _talk(write)
    assert requests == 1
    assert [s.method for s in seen] == ["runs/log-batch"]
    assert seen[0].body == {
        "run_id": RUN,
        "metrics": [
            {"key": "slurm.gpu_hours", "value": 2.0, "timestamp": 1_700_000_000_000, "step": 0},
            {"key": "slurm.gpus", "value": 1.0, "timestamp": 1_700_000_000_000, "step": 0}],
        "tags": [{"key": "slurm.user", "value": "alice"},
                 {"key": "slurm.job", "value": "x" * 5000}]}


def test_a_post_goes_to_the_api_path_under_the_uri_without_its_credentials() -> None:
    async def where(tracking: TrackingServer) -> str:
        await _tag(tracking)
        return tracking.url
    url, seen, server = _talk(where, userinfo="alice:pw@")
    assert url == server.url  # the trailing slash and the user:password@ dropped
    assert seen[0].path == "/api/2.0/mlflow/runs/set-tag"


def test_a_tracking_uri_with_a_path_keeps_it() -> None:
    async def go() -> tuple[str, list[Seen], str]:
        async with mlflow_stand_in() as server:
            async with TrackingServer(server.url + "/team-X/", 5.0, NO_ENV) as tracking:
                await _tag(tracking)
            return tracking.url, server.seen, server.url
    url, seen, base = asyncio.run(go())
    assert url == base + "/team-X"
    assert seen[0].path == "/team-X/api/2.0/mlflow/runs/set-tag"


def test_the_experiments_are_read_page_by_page_deleted_ones_too() -> None:
    pages = {"": Answer(body={"experiments": [{"experiment_id": "0"}, {"name": "no id"},
                                              "not an experiment", {"experiment_id": "4"}],
                              "next_page_token": "p2"}),
             "p2": Answer(body={"experiments": [{"experiment_id": 7}]})}

    def script(seen: Seen) -> Answer:
        return pages[seen.body.get("page_token", "")]
    async def both(tracking: TrackingServer) -> tuple[list[str], int]:
        return await tracking.experiment_ids(), tracking.requests
    (ids, requests), seen, _ = _talk(both, script)
    assert ids == ["0", "4", "7"] and requests == 2
    assert [(s.method, s.body) for s in seen] == [
        ("experiments/search", {"max_results": 1000, "view_type": "ALL"}),
        ("experiments/search", {"max_results": 1000, "view_type": "ALL", "page_token": "p2"})]


def test_an_answer_without_experiments_is_none() -> None:
    ids, seen, _ = _talk(lambda t: t.experiment_ids(), lambda s: Answer(body={}))
    assert ids == [] and len(seen) == 1


def test_a_server_that_pages_forever_is_asked_at_most_100_pages() -> None:
    def endless(seen: Seen) -> Answer:
        return Answer(body={"experiments": [{"experiment_id": str(len(seen.body))}],
                            "runs": [{"info": {}}], "next_page_token": "more"})
    ids, seen, _ = _talk(lambda t: t.experiment_ids(), endless)
    assert len(seen) == 100 and len(ids) == 100
    runs, seen, _ = _talk(lambda t: t.search_runs(["1"], "f"), endless)
    assert len(seen) == 100 and len(runs) == 100


def test_runs_are_searched_100_experiments_at_a_time_every_page() -> None:
    experiments = [str(i) for i in range(150)]

    def script(seen: Seen) -> Answer:
        first = seen.body["experiment_ids"][0]
        token = seen.body.get("page_token", "")
        runs: list[Any] = [{"info": {"run_id": f"{first}-{token or 'p1'}"}}, "not a run"]
        return Answer(body={"runs": runs, "next_page_token": "p2" if not token else ""})
    runs, seen, _ = _talk(lambda t: t.search_runs(experiments, "tags.x = 'y'"), script)
    assert [r["info"]["run_id"] for r in runs] == ["0-p1", "0-p2", "100-p1", "100-p2"]
    base = {"filter": "tags.x = 'y'", "max_results": 1000, "run_view_type": "ACTIVE_ONLY"}
    assert [s.body for s in seen] == [
        {"experiment_ids": experiments[:100], **base},
        {"experiment_ids": experiments[:100], **base, "page_token": "p2"},
        {"experiment_ids": experiments[100:], **base},
        {"experiment_ids": experiments[100:], **base, "page_token": "p2"}]
    assert {s.method for s in seen} == {"runs/search"}


def test_no_experiments_means_no_search() -> None:
    runs, seen, _ = _talk(lambda t: t.search_runs([], "f"))
    assert runs == [] and seen == []


def test_an_answer_without_runs_is_none() -> None:
    runs, _, _ = _talk(lambda t: t.search_runs(["1"], "f"), lambda s: Answer(body={}))
    assert runs == []


def test_an_empty_answer_is_an_empty_object() -> None:
    got, _, _ = _talk(lambda t: t.call("runs/search", {}), lambda s: Answer(body="  "))
    assert got == {}


def test_the_answers_json_object_is_returned() -> None:
    got, _, _ = _talk(lambda t: t.call("runs/search", {"a": 1}),
                      lambda s: Answer(body={"runs": [], "x": 1}))
    assert got == {"runs": [], "x": 1}


def test_a_call_outside_async_with_says_how_to_use_it() -> None:
    with pytest.raises(AssertionError, match=r"^use TrackingServer as 'async with'$"):
        asyncio.run(TrackingServer("http://127.0.0.1:9", 1.0, NO_ENV).call("x", {}))


def test_leaving_the_block_closes_the_session() -> None:
    async def go() -> bool:
        async with mlflow_stand_in() as server:
            tracking = TrackingServer(server.url, 5.0, NO_ENV)
            async with tracking:
                await _tag(tracking)
            session = tracking._session
            return session is not None and session.closed
    assert asyncio.run(go())


# -- credentials, from MLflow's own variables or the URI ------------------------------

@pytest.mark.parametrize(("environ", "userinfo", "authorization"), [
    ({"MLFLOW_TRACKING_TOKEN": "t0k"}, "", "Bearer t0k"),
    ({"MLFLOW_TRACKING_TOKEN": "t0k", "MLFLOW_TRACKING_USERNAME": "bob"}, "u:p@",
     "Bearer t0k"),
    ({"MLFLOW_TRACKING_USERNAME": "bob", "MLFLOW_TRACKING_PASSWORD": "s3cret"}, "u:p@",
     _basic("bob", "s3cret")),
    ({"MLFLOW_TRACKING_USERNAME": "bob"}, "", _basic("bob", "")),
    ({}, "al%40ce:p%3Ass:w@", _basic("al@ce", "p:ss:w")),
    ({"MLFLOW_TRACKING_TOKEN": "", "MLFLOW_TRACKING_USERNAME": ""}, "carol:pw@",
     _basic("carol", "pw")),
    ({}, "dave@", _basic("dave", "")),
    ({"mlflow_tracking_token": "lower", "mlflow_tracking_username": "lower"}, "", None),
])
def test_credentials_come_from_mlflows_variables_then_the_uri(
        environ: dict[str, str], userinfo: str, authorization: str | None) -> None:
    _, seen, _ = _talk(_tag, environ=environ, userinfo=userinfo)
    assert seen[0].headers.get("Authorization") == authorization



@pytest.mark.parametrize(("environ", "url", "words"), [
    ({"MLFLOW_TRACKING_USERNAME": "bo:b"}, "http://127.0.0.1:9/", "must not hold ':'"),
    ({}, "http://b%3Ab:pw@127.0.0.1:9/", "must not hold ':'"),
])
def test_a_user_name_basic_cannot_carry_is_one_clear_error(
        environ: dict[str, str], url: str, words: str) -> None:
    # A ':' in the user would move the split: refused before anything is sent.
    with pytest.raises(ReportError, match=words) as caught:
        TrackingServer(url, 5.0, environ)
    assert "pw" not in str(caught.value)


def test_a_password_beyond_ascii_goes_in_utf8_as_mlflows_server_reads_it() -> None:
    # MLflow's server (werkzeug) decodes Basic credentials as UTF-8: Latin-1 bytes of
    # the same password are answered 401 (the real server's test: test_mlflow_real).
    environ = {"MLFLOW_TRACKING_USERNAME": "jürgen", "MLFLOW_TRACKING_PASSWORD": "grün€"}
    _, seen, _ = _talk(_tag, environ=environ)
    assert seen[0].headers["Authorization"] == "Basic " + base64.b64encode(
        "jürgen:grün€".encode()).decode()

# -- TLS -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("mlflow-tls"))


def _tls(files: tuple[Path, Path]) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*files)
    return context


@pytest.mark.parametrize("environ", [
    {"MLFLOW_TRACKING_INSECURE_TLS": "true"}, {"MLFLOW_TRACKING_INSECURE_TLS": "True"}])
def test_insecure_tls_takes_a_certificate_nobody_signed(
        tls_files: tuple[Path, Path], environ: dict[str, str]) -> None:
    _, seen, _ = _talk(_tag, environ=environ, tls=_tls(tls_files))
    assert len(seen) == 1


def test_the_servers_ca_file_makes_its_certificate_trusted(tls_files: tuple[Path, Path]) -> None:
    environ = {"MLFLOW_TRACKING_SERVER_CERT_PATH": str(tls_files[0])}
    _, seen, _ = _talk(_tag, environ=environ, tls=_tls(tls_files))
    assert len(seen) == 1


@pytest.mark.parametrize("environ", [
    {}, {"MLFLOW_TRACKING_INSECURE_TLS": "yes"}, {"MLFLOW_TRACKING_INSECURE_TLS": "false"},
    {"mlflow_tracking_insecure_tls": "true"}])
def test_a_certificate_nobody_trusts_is_refused_by_default(
        tls_files: tuple[Path, Path], environ: dict[str, str]) -> None:
    exc, server = _fails(_tag, lambda s: Answer(), environ=environ, tls=_tls(tls_files))
    assert str(exc).startswith(f"cannot reach MLflow at {server.url} (")
    assert str(exc).endswith("); check --tracking-uri and that the tracking server runs")
    assert exc.exit_code == 3 and not server.seen


def test_a_ca_file_that_cannot_be_read_is_one_line_before_any_request(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    environ = {"MLFLOW_TRACKING_SERVER_CERT_PATH": str(missing)}
    with pytest.raises(ReportError) as caught:
        TrackingServer("https://mlflow.example.org", 1.0, environ)
    assert str(caught.value).startswith(
        f"cannot read MLFLOW_TRACKING_SERVER_CERT_PATH {missing}: ")
    assert "No such file" in str(caught.value) and caught.value.exit_code == 2


def test_tls_settings_are_not_read_for_plain_http(tmp_path: Path) -> None:
    _, seen, _ = _talk(_tag, environ={"MLFLOW_TRACKING_SERVER_CERT_PATH": str(tmp_path / "x")})
    assert len(seen) == 1


# -- failures, one line each -----------------------------------------------------------

@pytest.mark.parametrize("url", ["file:///var/mlruns", "mlruns", "HTTP://host", "ftp://u:pw@h"])
def test_a_tracking_uri_that_is_no_http_server_is_refused(url: str) -> None:
    with pytest.raises(ReportError) as caught:
        TrackingServer(url, 1.0, NO_ENV)
    shown = url.replace("u:pw@", "")
    assert str(caught.value) == (
        f"bad --tracking-uri {shown!r}: give the tracking server's http:// or https:// "
        "URL (a file store cannot be written here)")
    assert caught.value.exit_code == 2


def test_an_unreachable_server_is_one_line_without_credentials() -> None:
    async def go() -> ReportError:
        async with mlflow_stand_in() as server:
            url = server.url
        # The stand-in is gone: nothing listens on its port any more.
        async with TrackingServer(url.replace("://", "://al:pw@"), 5.0, NO_ENV) as tracking:
            try:
                await _tag(tracking)
            except ReportError as exc:
                assert tracking.url == url
                return exc
        raise AssertionError("no ReportError")
    exc = asyncio.run(go())
    assert str(exc).startswith("cannot reach MLflow at http://127.0.0.1:")
    assert "ClientConnectorError: Cannot connect to host 127.0.0.1:" in str(exc)
    assert str(exc).endswith("); check --tracking-uri and that the tracking server runs")
    assert "pw" not in str(exc) and exc.exit_code == 3


def test_a_server_slower_than_the_timeout_is_one_line() -> None:
    exc, _ = _fails(_tag, lambda s: Answer(delay_s=2.0), timeout_s=0.2)
    assert "(TimeoutError: " in str(exc) and exc.exit_code == 3


@pytest.mark.parametrize(("answer", "forbidden", "said"), [
    (Answer(403, {"error_code": "PERMISSION_DENIED", "message": "not yours"}), True,
     "403 PERMISSION_DENIED to runs/set-tag: not yours"),
    (Answer(403, "Forbidden"), True, "403 PERMISSION_DENIED to runs/set-tag: Forbidden"),
    (Answer(403, {"message": "no"}), True, "403 PERMISSION_DENIED to runs/set-tag: no"),
    (Answer(404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "gone"}), False,
     "404 RESOURCE_DOES_NOT_EXIST to runs/set-tag: gone"),
    (Answer(400, {"error_code": "INVALID_STATE", "message": "deleted"}), False,
     "400 INVALID_STATE to runs/set-tag: deleted"),
    (Answer(400, {"error_code": "INVALID_PARAMETER_VALUE"}), False,
     '400 INVALID_PARAMETER_VALUE to runs/set-tag: {"error_code": "INVALID_PARAMETER_VALUE"}'),
])
def test_a_run_that_cannot_be_written_is_skipped_alone(
        answer: Answer, forbidden: bool, said: str) -> None:
    exc, _ = _fails(_tag, lambda s: answer)
    assert isinstance(exc, RunNotWritable)
    assert (str(exc), exc.forbidden, exc.exit_code) == (f"MLflow answered {said}", forbidden, 3)


@pytest.mark.parametrize(("answer", "message"), [
    (Answer(400, {"error_code": "BAD_REQUEST", "message": "no"}), "400 to runs/set-tag: no"),
    (Answer(404, {"error_code": "ENDPOINT_NOT_FOUND", "message": "no"}),
     "404 to runs/set-tag: no"),
    (Answer(401, "who are you?"), "401 to runs/set-tag: who are you?"),
    (Answer(405, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "m"}),
     "405 to runs/set-tag: m"),
    (Answer(500, ["a", "list"]), '500 to runs/set-tag: ["a", "list"]'),
    (Answer(502, ""), "502 to runs/set-tag: no message"),
    (Answer(500, {"error_code": "E", "message": "bell\a" + "m" * 300}),
     "500 to runs/set-tag: bell\ufffd" + "m" * 195),
    (Answer(201, {}), "201 to runs/set-tag: {}"),
])
def test_any_other_error_ends_the_invocation_in_one_line(answer: Answer, message: str) -> None:
    exc, server = _fails(_tag, lambda s: answer)
    assert not isinstance(exc, RunNotWritable)
    assert str(exc) == (f"MLflow at {server.url} answered {message}; check --tracking-uri "
                        "and the MLFLOW_TRACKING_* credentials")
    assert exc.exit_code == 3


def test_mlflows_error_code_is_shown_short_and_plain() -> None:
    code = "C\x1b" + "D" * 100
    exc, _ = _fails(_tag, lambda s: Answer(404, {"error_code": code, "message": "m"}),
                    environ=NO_ENV)
    assert not isinstance(exc, RunNotWritable)
    forbidden, _ = _fails(_tag, lambda s: Answer(403, {"error_code": code, "message": "m"}))
    assert str(forbidden) == "MLflow answered 403 C\ufffd" + "D" * 58 + " to runs/set-tag: m"


def test_a_batch_mlflow_will_not_take_is_a_skipped_run() -> None:
    exc, _ = _fails(lambda t: t.log_batch(RUN, {"slurm.gpus": 1.0}, {}, 0),
                    lambda s: Answer(404, {"error_code": "RESOURCE_DOES_NOT_EXIST",
                                           "message": "gone"}))
    assert isinstance(exc, RunNotWritable)
    assert str(exc) == "MLflow answered 404 RESOURCE_DOES_NOT_EXIST to runs/log-batch: gone"


def test_an_error_without_a_run_is_never_a_skipped_run() -> None:
    exc, server = _fails(lambda t: t.call("runs/search", {}),
                         lambda s: Answer(403, {"error_code": "PERMISSION_DENIED",
                                                "message": "m"}))
    assert not isinstance(exc, RunNotWritable)
    assert str(exc) == (f"MLflow at {server.url} answered 403 to runs/search: m; check "
                        "--tracking-uri and the MLFLOW_TRACKING_* credentials")


@pytest.mark.parametrize("body", ["<html>hello</html>", "[1, 2]", '"text"'])
def test_an_answer_that_is_no_json_object_is_one_line(body: str) -> None:
    exc, server = _fails(lambda t: t.experiment_ids(), lambda s: Answer(200, body))
    assert str(exc) == (f"MLflow at {server.url} answered experiments/search with something "
                        "other than a JSON object; is --tracking-uri an MLflow tracking "
                        "server?")
    assert exc.exit_code == 3
