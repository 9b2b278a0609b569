"""The second look after a query is rewritten (enforce.restrict): the printed text is
parsed again and every selector in it, the parameter of ``topk``-style aggregates
included, must be restricted, and there must be as many as in the query. Printers
with the mistakes that check is there to catch are handed in; each must be refused.
Pure."""

from __future__ import annotations

from collections.abc import Callable

import promql_parser as pp
import pytest

from slurm_gpu_exporter.proxy.query.printer import Extra, to_promql
from slurm_gpu_exporter.proxy.query.restrict import QueryRefused, Scope, restrict, restrict_query

ALICE = Scope(admin=False, users=frozenset({"alice"}))
# Aggregates whose first argument is an expression of its own, with a selector in it.
WITH_PARAMETER = [
    "topk(scalar(count(slurm_job_info)), slurm_job_gpus)",
    "bottomk(scalar(count(slurm_job_info)), slurm_job_gpus)",
    "quantile(scalar(sum(slurm_job_info)) / 100, slurm_job_gpus)",
    "limitk(scalar(count(slurm_job_info)), slurm_job_gpus)",
    "limit_ratio(scalar(avg(slurm_job_info)), slurm_job_gpus)",
]


def skipping(name: str) -> Callable[[pp.Expr, Extra], str]:
    """A printer that adds nothing to the selectors of ``name`` (as one that forgot an
    aggregate's parameter would)."""

    def printer(node: pp.Expr, extra: Extra) -> str:
        return to_promql(node, lambda s: () if s.name == name else extra(s))

    return printer


def _parses(query: str) -> bool:
    try:
        pp.parse(query)
    except BaseException:  # the parser's panics are BaseExceptions
        return False
    return True


@pytest.mark.parametrize("query", [q for q in WITH_PARAMETER if _parses(q)])
def test_a_printer_that_misses_the_parameters_selector_is_refused(query: str) -> None:
    root = pp.parse(query)
    assert restrict(root, ALICE).count('user="alice"') == 2  # the real printer: both
    with pytest.raises(QueryRefused, match="could not be restricted"):
        restrict(root, ALICE, printer=skipping("slurm_job_info"))


def test_a_printer_that_misses_a_selector_anywhere_is_refused() -> None:
    query = 'sum(rate(slurm_job_gpus[5m])) / on() group_left count(slurm_job_info{a="b"})'
    for name in ("slurm_job_gpus", "slurm_job_info"):
        with pytest.raises(QueryRefused, match="could not be restricted"):
            restrict(pp.parse(query), ALICE, printer=skipping(name))


def test_a_printer_that_adds_or_drops_a_selector_is_refused() -> None:
    root = pp.parse("topk(scalar(count(slurm_job_info)), slurm_job_gpus)")

    def adds(node: pp.Expr, extra: Extra) -> str:
        return to_promql(node, extra) + ' or slurm_job_gpus{user="alice"}'

    def drops(node: pp.Expr, extra: Extra) -> str:
        return 'topk(scalar(count(vector(1))), slurm_job_gpus{user="alice"})'

    for printer in (adds, drops):
        with pytest.raises(QueryRefused, match="could not be restricted"):
            restrict(root, ALICE, printer=printer)


def test_a_function_that_reads_unnamed_series_is_refused_inside_a_parameter() -> None:
    query = "topk(scalar(count(info(slurm_job_gpus))), slurm_job_gpus)"
    if not _parses(query):
        pytest.skip("this promql-parser does not know info()")
    with pytest.raises(QueryRefused, match="only admins"):
        restrict_query(query, ALICE)
