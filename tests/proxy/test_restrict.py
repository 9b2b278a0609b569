"""The proxy's enforcement on promql-parser's AST: an attacker's query list, pure."""

from __future__ import annotations

import promql_parser as pp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_gpu_exporter.proxy.query.printer import match_op, quote
from slurm_gpu_exporter.proxy.query.restrict import (
    MAX_DEPTH,
    QueryRefused,
    Scope,
    default_series_selectors,
    restrict_query,
    restrict_series_selector,
)

PUBLIC = frozenset({"cluster:slurm_gpus:count"})
ALICE = Scope(admin=False, users=frozenset({"alice"}), public=PUBLIC)
ADMIN = Scope(admin=True)


def selectors(text: str) -> list[pp.VectorSelector]:
    """Every vector selector of a query, found by the library's own walk (not ours)."""
    found: list[pp.VectorSelector] = []
    pp.walk(pp.parse(text),
            pre_visit=lambda n: found.append(n) if isinstance(n, pp.VectorSelector) else None)
    return found


def user_matchers(selector: pp.VectorSelector) -> list[tuple[str, str]]:
    return [(match_op(m.op), m.value) for m in selector.matchers.matchers if m.name == "user"]


def name(selector: pp.VectorSelector) -> str | None:
    return selector.name or next((m.value for m in selector.matchers.matchers
                                  if m.name == "__name__" and m.op == pp.MatchOp.Equal), None)


def assert_only(text: str, user: str) -> None:
    """Every selector of ``text`` is pinned to ``user`` by equality, or is public."""
    found = selectors(text)
    assert found, text
    for s in found:
        if name(s) in PUBLIC:
            continue
        assert any(m.name == "user" and m.op == pp.MatchOp.Equal and m.value == user
                   for m in s.matchers.matchers), (text, str(s))


ATTACKS = [
    'slurm_job_gpus{user=~".+"}',
    'slurm_job_gpus{user!="alice"}',
    'slurm_job_gpus{user!~"alice"}',
    'slurm_job_gpus{user=~"alice|bob"}',
    'slurm_job_gpus{user="alice"} or slurm_job_gpus{user="bob"}',
    'slurm_job_gpus{user="alice"} or slurm_job_gpus',
    'slurm_job_gpus unless slurm_job_gpus{user="alice"}',
    'slurm_job_gpus{user="alice"} + on() group_left sum(slurm_job_gpus)',
    'slurm_job_gpus * on(jobid) group_left(user) slurm_job_info',
    'label_replace(slurm_job_gpus, "user", "alice", "", "")',
    'label_join(slurm_job_gpus, "user", ",", "jobid")',
    'max_over_time(slurm_job_gpus{user="bob"}[10m:1s])',
    'max_over_time((slurm_job_gpus or slurm_job_info)[10m:1s] offset 1m)',
    'slurm_job_gpus @ 1700000000 offset 5m',
    'rate(slurm_job_cpu_seconds_total[5m] @ end())',
    '{__name__=~".+"}',
    '{__name__=~"cluster:.+|slurm_job_info"}',
    'count by (user) (slurm_job_info)',
    'count_values("user", slurm_job_gpus)',
    'absent(slurm_job_info{user="bob"})',
    'topk(scalar(count(slurm_job_info{user="bob"})), slurm_job_gpus)',
    'quantile(scalar(sum(slurm_job_gpus)) / 100, slurm_job_gpus)',
    'sort_desc(-(slurm_job_gpus ^ 2))',
    'vector(1) * on() group_left() count(slurm_job_info)',
    'cluster:slurm_gpus:count + on() group_left slurm_job_gpus',
    'slurm_job_gpus{jobid="1\\"} or {__name__=~\\".+"}',
]


@pytest.mark.parametrize("query", ATTACKS)
def test_every_selector_of_an_attack_is_pinned_to_the_caller(query: str) -> None:
    restricted = restrict_query(query, ALICE)
    assert_only(restricted, "alice")
    # The query's own selectors are all still there: nothing was dropped or added.
    assert len(selectors(restricted)) == len(selectors(query))


def test_a_selector_of_a_public_family_is_left_whole() -> None:
    restricted = restrict_query("sum(cluster:slurm_gpus:count) / sum(slurm_job_gpus)", ALICE)
    public, private = selectors(restricted)
    assert user_matchers(public) == []
    assert user_matchers(private) == [("=", "alice")]


def test_a_regex_over_names_that_covers_a_public_family_is_not_public() -> None:
    (selector,) = selectors(restrict_query('{__name__=~"cluster:slurm_gpus:count"}', ALICE))
    assert user_matchers(selector) == [("=", "alice")]


def test_a_label_value_that_looks_like_promql_stays_one_value() -> None:
    value = '"} or {__name__=~".+"} or x{a="'
    restricted = restrict_query(f"slurm_job_gpus{{jobid={quote(value)}}}", ALICE)
    (selector,) = selectors(restricted)
    assert [m.value for m in selector.matchers.matchers if m.name == "jobid"] == [value]
    assert user_matchers(selector) == [("=", "alice")]


@given(st.text(max_size=40))
def test_any_label_value_survives_printing(value: str) -> None:
    restricted = restrict_query(f"slurm_job_gpus{{jobid={quote(value)}}}", ALICE)
    (selector,) = selectors(restricted)
    assert [m.value for m in selector.matchers.matchers if m.name == "jobid"] == [value]


def test_modifiers_survive_restriction() -> None:
    restricted = restrict_query(
        'rate(slurm_job_cpu_seconds_total{jobid="7"}[5m] offset 1m @ 1700000000)', ALICE)
    call = pp.parse(restricted)
    inner = call.args[0].vector_selector
    assert inner.offset.total_seconds() == 60
    assert inner.at.at.timestamp() == 1700000000
    assert call.args[0].range.total_seconds() == 300


def test_a_coordinator_sees_an_exact_list_of_users() -> None:
    scope = Scope(admin=False, users=frozenset({"carol", "dave.x"}))
    (selector,) = selectors(restrict_query("slurm_job_gpus", scope))
    # Prometheus anchors the regex; the dot is escaped, so "davexx" cannot match.
    assert user_matchers(selector) == [("=~", "carol|dave\\.x")]


def test_an_admin_query_goes_upstream_as_written() -> None:
    query = 'sum by (user) (slurm_job_gpus{user=~".+"})'
    assert restrict_query(query, ADMIN) == query


@pytest.mark.parametrize("query", ["slurm_job_gpus{", "sum(", "foo bar", ""])
def test_a_query_that_does_not_parse_is_refused_with_the_parsers_message(query: str) -> None:
    with pytest.raises(QueryRefused, match=r"does not parse: .+"):
        restrict_query(query, ALICE)
    with pytest.raises(QueryRefused):
        restrict_query(query, ADMIN)


@pytest.mark.parametrize(("query", "reason"), [
    ("info(slurm_job_gpus)", "only admins"),
    ('slurm_job_gpus{user="a" or user="b"}', "`or` between matchers"),
    ("slurm_job_gpus offset -5m", "negative durations"),
    ("slurm_job_gpus @ -100", "could not be restricted"),
    ("1 + " * 1001 + "1", "operators and brackets"),
    ("x" * 17000, "bytes"),
    ("-" * (MAX_DEPTH + 1) + "slurm_job_gpus", "nests deeper"),
])
def test_what_cannot_be_restricted_safely_is_refused(query: str, reason: str) -> None:
    with pytest.raises(QueryRefused, match=reason):
        restrict_query(query, ALICE)


def test_series_selectors_are_restricted_and_must_be_selectors() -> None:
    assert_only(restrict_series_selector('{__name__=~".+"}', ALICE), "alice")
    with pytest.raises(QueryRefused, match="not a series selector"):
        restrict_series_selector("sum(slurm_job_gpus)", ALICE)


def test_label_requests_without_match_see_own_series_and_public_families() -> None:
    assert default_series_selectors(ALICE) == [
        '{user="alice"}', '{__name__="cluster:slurm_gpus:count"}']
