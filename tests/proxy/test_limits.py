"""The bounds on a query's raw text (limits.py): counted on the text as it came, so no
comment or string can hide what follows it; pure."""

from __future__ import annotations

import time

import pytest

from slurm_gpu_exporter.proxy.query.limits import (
    MAX_DEPTH,
    MAX_OPERATORS,
    LimitExceeded,
    check_query_text,
    raw_depth,
)
from slurm_gpu_exporter.proxy.query.restrict import QueryRefused, Scope, restrict_query

ALICE = Scope(admin=False, users=frozenset({"alice"}))
# Issue 33's attack: a `"` in a comment made the old count skip everything after it.
COMMENT_HIDDEN = '# "\n' + "(" * 8000 + "1" + ")" * 8000 + '\n# "'


def test_the_comment_hidden_query_is_refused_before_it_is_parsed() -> None:
    started = time.perf_counter()
    with pytest.raises(QueryRefused, match="operators and brackets") as refused:
        restrict_query(COMMENT_HIDDEN, ALICE)
    # The parser took 33 s over this query; the count takes well under a millisecond.
    assert time.perf_counter() - started < 0.5
    assert refused.value.reason == "limit"


@pytest.mark.parametrize("hiding", ['# "\n', "# '\n", "# `\n", '"', "'", "`",
                                    'x{a="', "# ) ] }\n"])
def test_no_comment_or_string_hides_brackets_from_the_count(hiding: str) -> None:
    with pytest.raises(LimitExceeded):
        check_query_text(hiding + "(" * MAX_OPERATORS + "1")


def test_operator_keywords_count_in_any_case() -> None:
    with pytest.raises(LimitExceeded, match="operators"):
        check_query_text(" AND ".join(["x"] * (MAX_OPERATORS + 2)))


def test_depth_counts_brackets_in_strings_too() -> None:
    regex = "(" * (MAX_DEPTH + 1) + ")" * (MAX_DEPTH + 1)
    with pytest.raises(LimitExceeded, match="nests brackets"):
        check_query_text(f'x{{a=~"{regex}"}}')


def test_closing_brackets_the_parser_ignores_cost_their_share_of_the_budget() -> None:
    # Closers in comments lower the raw depth below the parser's, but each one counts:
    # nesting 2 * MAX_DEPTH + 1 deep this way is past the budget.
    hidden = "(" * MAX_DEPTH + "\n# " + ")" * MAX_DEPTH + "\n"
    text = hidden * 2 + "(1" + ")" * (2 * MAX_DEPTH + 1)
    assert raw_depth(text) <= MAX_DEPTH
    with pytest.raises(LimitExceeded, match="operators"):
        check_query_text(text)


def test_the_largest_shipped_queries_are_far_inside_the_limits() -> None:
    # Like the largest rule expression (48 operators and brackets, 6 deep).
    rule = ("(sum by (cluster, jobid, user) (rate(slurm_job_gpu_busy_seconds_total[5m])) / "
            "sum by (cluster, jobid, user) (rate(slurm_job_gpu_allocated_seconds_total[5m])))"
            " < 0.1 and on (cluster, jobid) (time() - max by (cluster, jobid) "
            "(slurm_job_start_time_seconds)) > 3600")
    check_query_text(rule)
    assert raw_depth(rule) < 10


def test_a_lone_surrogate_is_counted_not_a_crash() -> None:
    check_query_text('x{a="\udcff"}')
    with pytest.raises(LimitExceeded, match="bytes"):
        check_query_text("\udcff" * 6000)
