"""The query checker's side of its pipe, in process: the length-prefixed JSON messages,
what it answers for a user, an admin and a ``match[]`` selector, and a stream of
requests answered in turn. And the proxy's own metrics as Prometheus reads them."""

from __future__ import annotations

import io
import struct

from slurm_gpu_exporter.proxy.observe import ProxyMetrics
from slurm_gpu_exporter.proxy.query.check_worker import (
    HEADER,
    answer,
    encode_message,
    read_message,
    serve,
)


def _request(text: str, kind: str = "query", admin: bool = False,
             users: tuple[str, ...] = ("alice",), public: tuple[str, ...] = ()) -> dict:
    return {"kind": kind, "text": text, "admin": admin, "users": list(users),
            "public": list(public)}


def test_a_message_is_a_four_byte_big_endian_length_and_json() -> None:
    raw = encode_message({"text": "up"})
    assert raw == struct.pack(">I", 14) + b'{"text": "up"}'
    assert HEADER.size == 4
    stream = io.BytesIO(raw + encode_message({"a": [1, 2]}))
    assert read_message(stream) == {"text": "up"}
    assert read_message(stream) == {"a": [1, 2]}
    assert read_message(stream) is None  # the end: the proxy closed the pipe
    assert read_message(io.BytesIO(b"\x00\x00")) is None  # a header cut short


def test_a_users_query_comes_back_restricted_to_them() -> None:
    assert answer(_request("sum(up)")) == {"text": 'sum ({__name__="up",user="alice"})'}
    assert answer(_request("up", users=("alice", "bob"))) == {
        "text": '{__name__="up",user=~"alice|bob"}'}
    assert answer(_request("a:b", public=("a:b",))) == {"text": '{__name__="a:b"}'}


def test_an_admins_query_goes_as_written() -> None:
    assert answer(_request("sum( up )", admin=True, users=())) == {"text": "sum( up )"}


def test_a_selector_is_checked_as_a_selector() -> None:
    assert answer(_request("up", kind="selector")) == {
        "text": '{__name__="up",user="alice"}'}
    assert answer(_request("sum(up)", kind="selector")) == {
        "refused": "match[] 'sum(up)' is not a series selector", "reason": "bad_query"}
    # the same text as a query is fine
    assert "text" in answer(_request("sum(up)", kind="query"))


def test_a_refusal_carries_its_message_and_reason() -> None:
    refused = answer(_request("info(up)"))
    assert refused == {"refused": "info() reads series the query does not name; only admins "
                                  "may use it", "reason": "function"}
    assert answer(_request("sum(")).get("reason") == "bad_query"


def test_requests_are_answered_in_turn_until_the_pipe_closes() -> None:
    requests = io.BytesIO(encode_message(_request("up")) + encode_message(_request("info(up)")))
    answers = io.BytesIO()
    serve(requests, answers)
    answers.seek(0)
    assert read_message(answers) == {"text": '{__name__="up",user="alice"}'}
    assert read_message(answers)["reason"] == "function"  # type: ignore[index]
    assert read_message(answers) is None


def test_the_proxys_metrics_have_their_names_help_and_labels() -> None:
    metrics = ProxyMetrics()
    metrics.requests.labels("query", "200").inc()
    metrics.refusals.labels("limit").inc()
    metrics.upstream_seconds.labels("query").observe(0.003)
    metrics.upstream_errors.labels("query_range").inc()
    metrics.connections_refused.inc()
    text = metrics.exposition().decode()
    lines = set(text.splitlines())
    assert {
        "# HELP slurm_gpu_proxy_requests_total Requests answered, by endpoint and HTTP status.",
        'slurm_gpu_proxy_requests_total{code="200",endpoint="query"} 1.0',
        "# HELP slurm_gpu_proxy_refusals_total Requests refused, by reason.",
        'slurm_gpu_proxy_refusals_total{reason="limit"} 1.0',
        "# HELP slurm_gpu_proxy_upstream_duration_seconds Time the upstream Prometheus took "
        "to answer, by endpoint.",
        'slurm_gpu_proxy_upstream_duration_seconds_bucket{endpoint="query",le="0.0025"} 0.0',
        'slurm_gpu_proxy_upstream_duration_seconds_bucket{endpoint="query",le="0.005"} 1.0',
        'slurm_gpu_proxy_upstream_duration_seconds_bucket{endpoint="query",le="60.0"} 1.0',
        "# HELP slurm_gpu_proxy_upstream_errors_total Upstream requests that got no answer "
        "(refused connection, timeout) or one past the size limit.",
        'slurm_gpu_proxy_upstream_errors_total{endpoint="query_range"} 1.0',
        "# HELP slurm_gpu_proxy_connections_refused_total Connections closed at once because "
        "the proxy had its maximum open, every one in a request.",
        "slurm_gpu_proxy_connections_refused_total 1.0",
    } <= lines
    buckets = [line.split('le="')[1].split('"')[0] for line in text.splitlines()
               if line.startswith("slurm_gpu_proxy_upstream_duration_seconds_bucket")]
    assert buckets == ["0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25",
                       "0.5", "1.0", "2.5", "5.0", "10.0", "30.0", "60.0", "+Inf"]
