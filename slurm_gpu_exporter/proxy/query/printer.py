"""Print a promql-parser AST back to PromQL, one line, every string escaped, with
matchers added to selectors on the way (the proxy's restriction).

promql-parser's own ``str()`` does not escape quotes in label values, its
``prettify()`` does not reflect edits to the tree, and the library cannot build a
selector, so the proxy prints the tree itself. Every node type is handled
explicitly; anything else is refused, so a parser upgrade with a new node cannot
slip through unprinted.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from datetime import timedelta

import promql_parser as pp

LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# The library's enums are not hashable: a list of pairs, compared with ==.
_MATCH_OPS = ((pp.MatchOp.Equal, "="), (pp.MatchOp.NotEqual, "!="), (pp.MatchOp.Re, "=~"),
              (pp.MatchOp.NotRe, "!~"))


# What to add to a selector's matchers as it is printed.
Extra = Callable[[pp.VectorSelector], tuple[pp.Matcher, ...]]


class Unprintable(ValueError):
    """The tree holds something this printer does not know how to write safely."""


def quote(value: str) -> str:
    """A PromQL double-quoted string: JSON's escapes are all valid Go escapes."""
    return json.dumps(value, ensure_ascii=False)


def duration(value: timedelta) -> str:
    if value < timedelta(0):
        raise Unprintable("negative durations are not supported")
    return pp.display_duration(value)


def number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return repr(float(value))


def label_name(name: str) -> str:
    if not LABEL_NAME.fullmatch(name):
        raise Unprintable(f"label name {name!r} needs quoting, which is not supported")
    return name


def match_op(op: pp.MatchOp) -> str:
    for known, text in _MATCH_OPS:
        if op == known:
            return text
    raise Unprintable(f"unknown match operator {op}")


def matcher(m: pp.Matcher) -> str:
    return f"{label_name(m.name)}{match_op(m.op)}{quote(m.value)}"


def matchers(selector: pp.VectorSelector, extra: tuple[pp.Matcher, ...] = ()) -> str:
    """``{__name__="x",a="b",…}``: the name as a matcher, so no metric name is ever
    read as a keyword."""
    if selector.matchers.or_matchers:
        raise Unprintable("`or` inside a selector's braces is not PromQL")
    parts = [f"__name__={quote(selector.name)}"] if selector.name is not None else []
    parts += [matcher(m) for m in [*selector.matchers.matchers, *extra]]
    return "{" + ",".join(parts) + "}"


def modifiers(selector_or_subquery: pp.VectorSelector | pp.SubqueryExpr) -> str:
    out = ""
    at = selector_or_subquery.at
    if at is not None:
        if at.type == pp.AtModifierType.Start:
            out += " @ start()"
        elif at.type == pp.AtModifierType.End:
            out += " @ end()"
        elif at.at is not None:
            out += f" @ {at.at.timestamp():.3f}"
        else:
            raise Unprintable("an @ modifier without a time")
    if selector_or_subquery.offset is not None:
        out += f" offset {duration(selector_or_subquery.offset)}"
    return out


def _labels(names: list[str]) -> str:
    return "(" + ", ".join(label_name(n) for n in names) + ")"


def _binary_modifier(mod: pp.BinModifier | None) -> str:
    if mod is None:
        return ""
    if mod.fill_values is not None and (mod.fill_values.lhs is not None
                                        or mod.fill_values.rhs is not None):
        raise Unprintable("fill modifiers are not supported")
    out = " bool" if mod.return_bool else ""
    if mod.matching is not None:
        keyword = "on" if mod.matching.type == pp.LabelModifierType.Include else "ignoring"
        out += f" {keyword} {_labels(mod.matching.labels)}"
    if mod.card == pp.VectorMatchCardinality.ManyToOne:
        out += f" group_left {_labels(mod.group_labels or [])}"
    elif mod.card == pp.VectorMatchCardinality.OneToMany:
        out += f" group_right {_labels(mod.group_labels or [])}"
    return out


def _no_extra(selector: pp.VectorSelector) -> tuple[pp.Matcher, ...]:
    return ()


def to_promql(node: pp.Expr, extra: Extra = _no_extra) -> str:
    """PromQL text for ``node``, with ``extra(selector)`` added to each selector's
    matchers; raises Unprintable for what it cannot write."""

    def sub(child: pp.Expr) -> str:
        return to_promql(child, extra)

    if isinstance(node, pp.VectorSelector):
        return matchers(node, extra(node)) + modifiers(node)
    if isinstance(node, pp.MatrixSelector):
        inner = node.vector_selector
        return f"{matchers(inner, extra(inner))}[{duration(node.range)}]{modifiers(inner)}"
    if isinstance(node, pp.SubqueryExpr):
        step = duration(node.step) if node.step is not None else ""
        return f"{sub(node.expr)}[{duration(node.range)}:{step}]{modifiers(node)}"
    if isinstance(node, pp.NumberLiteral):
        return number(node.val)
    if isinstance(node, pp.StringLiteral):
        return quote(node.val)
    if isinstance(node, pp.ParenExpr):
        return f"({sub(node.expr)})"
    if isinstance(node, pp.UnaryExpr):
        return f"-{sub(node.expr)}"
    if isinstance(node, pp.BinaryExpr):
        return f"{sub(node.lhs)} {node.op}{_binary_modifier(node.modifier)} {sub(node.rhs)}"
    if isinstance(node, pp.AggregateExpr):
        grouping = ""
        if node.modifier is not None:
            keyword = "by" if node.modifier.type == pp.AggModifierType.By else "without"
            grouping = f" {keyword} {_labels(node.modifier.labels)}"
        args = [sub(node.param)] if node.param is not None else []
        args.append(sub(node.expr))
        return f"{node.op}{grouping} ({', '.join(args)})"
    if isinstance(node, pp.Call):
        return f"{node.func.name}({', '.join(sub(a) for a in node.args)})"
    raise Unprintable(f"unknown expression type {type(node).__name__}")
