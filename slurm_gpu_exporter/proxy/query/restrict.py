"""Who sees which series: every selector of a query gets the caller's ``user`` matcher.

Enforcement works on promql-parser's AST, never on the query's text:

1. bound its raw text (limits.py), then parse it (a query that does not parse is
   refused with the parser's message). The proxy runs all of this in worker processes
   with a time limit (check_pool.py);
2. add ``user="<caller>"`` (a coordinator: ``user=~"a|b"``, an exact list) to every
   vector and matrix selector, wherever it sits (function arguments, aggregation
   parameters, subqueries, both sides of every binary operator), unless the selector
   can only select a family the site made public. Prometheus ANDs a selector's
   matchers, so no matcher of the query can widen it;
3. print the tree with the matchers added (printer.py), parse that text again and
   check that it has as many selectors as the query, each restricted: what goes
   upstream is what was checked.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import promql_parser as pp

from slurm_gpu_exporter.proxy.query.limits import MAX_DEPTH, LimitExceeded, check_query_text
from slurm_gpu_exporter.proxy.query.printer import Extra, Unprintable, quote, to_promql

USER_LABEL = "user"
# Functions that select series the query does not name (Prometheus 3's info() reads
# target_info by itself): no matcher could be added to what they read.
IMPLICIT_SELECTION = frozenset({"info"})

# Prints a tree with matchers added to its selectors (printer.to_promql).
Printer = Callable[[pp.Expr, Extra], str]
_NO_UNWIND = (KeyboardInterrupt, SystemExit, asyncio.CancelledError)


class QueryRefused(ValueError):
    """The query cannot be run for this caller; the message says why and is for them.
    ``reason`` names the kind, for the proxy's refusal counts."""

    def __init__(self, message: str, reason: str = "bad_query") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Scope:
    """What a caller may see: everything (admin), or the series of these users plus the
    public families."""

    admin: bool
    users: frozenset[str] = frozenset()
    public: frozenset[str] = frozenset()

    def user_matcher(self) -> pp.Matcher:
        if len(self.users) == 1:
            (user,) = self.users
            return pp.Matcher(pp.MatchOp.Equal, USER_LABEL, user)
        # Prometheus anchors the regex at both ends; an empty set matches no series.
        pattern = "|".join(re.escape(u) for u in sorted(self.users)) or "$^"
        return pp.Matcher(pp.MatchOp.Re, USER_LABEL, pattern)


def parse(query: str) -> pp.Expr:
    """The AST of ``query``, or QueryRefused with the parser's message (or the limit
    its raw text is past: limits.py)."""
    try:
        check_query_text(query)
    except LimitExceeded as exc:
        raise QueryRefused(str(exc), reason="limit") from None
    try:
        return pp.parse(query)
    except _NO_UNWIND:
        raise
    except BaseException as exc:  # the parser's panics are BaseExceptions
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise QueryRefused(f"query does not parse: {message}") from None


def children(node: pp.Expr) -> list[pp.Expr]:
    """The sub-expressions of ``node``, for every node type the parser makes."""
    if isinstance(node, (pp.VectorSelector, pp.NumberLiteral, pp.StringLiteral)):
        return []
    if isinstance(node, pp.MatrixSelector):
        return [node.vector_selector]
    if isinstance(node, (pp.SubqueryExpr, pp.ParenExpr, pp.UnaryExpr)):
        return [node.expr]
    if isinstance(node, pp.BinaryExpr):
        return [node.lhs, node.rhs]
    if isinstance(node, pp.AggregateExpr):
        return [node.param, node.expr] if node.param is not None else [node.expr]
    if isinstance(node, pp.Call):
        return list(node.args)
    raise QueryRefused(f"query holds an expression of unknown type {type(node).__name__}")


def nodes(root: pp.Expr) -> Iterator[pp.Expr]:
    """Every node of the tree, depth first; QueryRefused past MAX_DEPTH levels."""
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise QueryRefused(f"query nests deeper than {MAX_DEPTH} levels; flatten it")
        yield node
        stack.extend((child, depth + 1) for child in reversed(children(node)))


def selector_names(selector: pp.VectorSelector) -> set[str]:
    """The metric names a selector is pinned to by equality (all its matchers AND)."""
    names = {selector.name} if selector.name is not None else set()
    names |= {m.value for m in selector.matchers.matchers
              if m.name == "__name__" and m.op == pp.MatchOp.Equal}
    return names


def is_public(selector: pp.VectorSelector, scope: Scope) -> bool:
    return bool(selector_names(selector) & scope.public)


def is_restricted(selector: pp.VectorSelector, scope: Scope) -> bool:
    wanted = scope.user_matcher()
    return is_public(selector, scope) or any(
        m.name == wanted.name and m.op == wanted.op and m.value == wanted.value
        for m in selector.matchers.matchers)


def _check_supported(root: pp.Expr) -> int:
    """Refuse what cannot be restricted; the number of selectors in the tree."""
    selectors = 0
    for node in nodes(root):
        if isinstance(node, pp.Call) and node.func.name in IMPLICIT_SELECTION:
            raise QueryRefused(f"{node.func.name}() reads series the query does not name; "
                               "only admins may use it", reason="function")
        if isinstance(node, pp.VectorSelector):
            selectors += 1
            if node.matchers.or_matchers:
                raise QueryRefused("`or` between matchers in one selector is not supported")
    return selectors


def restrict(root: pp.Expr, scope: Scope, printer: Printer = to_promql) -> str:
    """The PromQL text of ``root`` with every non-public selector restricted to ``scope``.

    What ``printer`` wrote is parsed again and checked, so a printer that misses a
    selector (tests hand in such printers) is refused, never forwarded."""
    selectors = _check_supported(root)
    wanted = (scope.user_matcher(),)

    def extra(selector: pp.VectorSelector) -> tuple[pp.Matcher, ...]:
        return () if is_public(selector, scope) else wanted

    try:
        text = printer(root, extra)
        check = pp.parse(text)
    except Unprintable as exc:
        raise QueryRefused(f"query cannot be passed on: {exc}") from None
    except _NO_UNWIND:
        raise
    except BaseException as exc:
        raise QueryRefused(f"query could not be restricted ({exc}); simplify it") from None
    after = [n for n in nodes(check) if isinstance(n, pp.VectorSelector)]
    if len(after) != selectors or not all(is_restricted(s, scope) for s in after):
        raise QueryRefused("query could not be restricted to your series; simplify it")
    return text


def restrict_query(query: str, scope: Scope) -> str:
    """The query to send upstream for this caller: the caller's own text for an admin
    (after it parses), else the restricted one. Raises QueryRefused."""
    root = parse(query)
    if scope.admin:
        return query
    return restrict(root, scope)


def restrict_series_selector(selector: str, scope: Scope) -> str:
    """A ``match[]`` of the series and label endpoints, restricted like a query."""
    root = parse(selector)
    if not isinstance(root, pp.VectorSelector):
        raise QueryRefused(f"match[] {selector!r} is not a series selector")
    if scope.admin:
        return selector
    return restrict(root, scope)


def default_series_selectors(scope: Scope) -> list[str]:
    """What a non-admin's label and label-value requests without match[] are limited to:
    their own series and the public families."""
    wanted = scope.user_matcher()
    op = "=" if wanted.op == pp.MatchOp.Equal else "=~"
    own = [f"{{{USER_LABEL}{op}{quote(wanted.value)}}}"]
    return own + [f"{{__name__={quote(name)}}}" for name in sorted(scope.public)]
