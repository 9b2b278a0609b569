"""Bounds on a query's raw text, checked before anything parses it.

The parser's cost grows with the square of a query's nesting (and of a chain of binary
operators), so what it is given must be bounded first. The bounds are counted on the
text exactly as it came: nothing is taken out for comments or strings, because a
lexer of our own that reads a comment or a string differently from the parser's (a
``"`` inside a ``# `` comment, say) would hide the rest of the query from the count.
Brackets and operators inside strings and comments are counted too; over-counting
only refuses a query, it never lets one through.
"""

from __future__ import annotations

import re

MAX_QUERY_BYTES = 16 * 1024
# Binary operators, comparison and matcher operators, and every bracket, opening and
# closing, counted as below. The dashboards' and rules' largest query has 48.
MAX_OPERATORS = 1000
MAX_DEPTH = 200

# Counted with str.count, at C speed (the count runs on the event loop for every
# query): one character at a time (`==` counts twice), and the keywords anywhere, in any
# case (the `or` of `memory` too). Both over-count, which is safe.
_OPERATOR_CHARACTERS = "-+*/%^()[]{}=!<>"
_OPERATOR_KEYWORDS = ("and", "or", "unless", "atan2")
_BRACKETS = re.compile(r"[()\[\]{}]")
_OPENING = frozenset("([{")


class LimitExceeded(ValueError):
    """The query's text is past one of the bounds; the message says which and what to do."""


def text_bytes(text: str) -> int:
    # surrogatepass: a lone surrogate is counted, not a reason to fail.
    return len(text.encode("utf-8", "surrogatepass"))


def raw_depth(text: str) -> int:
    """The deepest bracket nesting of the raw text, strings and comments included.

    A closing bracket the parser does not see (in a comment or a string) can lower this
    below the parser's depth, but each one costs a unit of the MAX_OPERATORS budget, so
    the parser's depth stays bounded by the two limits together (about 400 levels)."""
    depth = deepest = 0
    for match in _BRACKETS.finditer(text):
        if match.group() in _OPENING:
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth = max(0, depth - 1)
    return deepest


def check_query_text(text: str) -> None:
    """Raise LimitExceeded when ``text`` is too long, has too many operators and
    brackets, or nests too deep. Linear in the text, and cheap enough for the event loop."""
    size = text_bytes(text)
    if size > MAX_QUERY_BYTES:
        raise LimitExceeded(f"query is {size} bytes, more than the {MAX_QUERY_BYTES} "
                            "allowed; shorten it")
    lowered = text.lower()
    operators = (sum(map(text.count, _OPERATOR_CHARACTERS))
                 + sum(map(lowered.count, _OPERATOR_KEYWORDS)))
    if operators > MAX_OPERATORS:
        raise LimitExceeded(f"query has {operators} operators and brackets (comments and "
                            f"strings count too), more than the {MAX_OPERATORS} allowed; "
                            "split it")
    depth = raw_depth(text)
    if depth > MAX_DEPTH:
        raise LimitExceeded(f"query nests brackets {depth} deep (comments and strings "
                            f"count too), deeper than the {MAX_DEPTH} allowed; flatten it")
