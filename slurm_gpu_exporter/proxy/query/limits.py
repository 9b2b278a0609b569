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


# Counted repetitions in regexes: the parser compiles every regex matcher, and a count
# multiplies the compiled program (`\w{100}` takes it about 80 ms; twenty of them, or
# `((\w{10}){10}){10}`, take seconds). Real queries use none, or a `\d{1,10}`.
MAX_REPEAT = 100
MAX_REPEAT_TOTAL = 250
_COUNT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_REPEAT_TOKENS = re.compile(r"\{\s*\d+\s*(?:,\s*\d*\s*)?\}|[()]")
# A digit, brace or comma written as a string escape (\x31, \u007b, \061) would be a
# count the raw text does not show; nobody writes those so.
_ESCAPED_COUNT = re.compile(r"\\(?:x(?:3\d|2c|7[bd])|u00(?:3\d|2c|7[bd])"
                            r"|U000000(?:3\d|2c|7[bd])|0[67][0-7]|054|17[35])", re.I)


def repetition_weight(text: str) -> int:
    """What the counted repetitions of ``text``'s regexes would cost the parser, in
    repeated units: each count times one plus what the group it repeats holds, summed.
    Counted on the raw text like the other bounds (brackets in strings and comments
    included): it over-counts, never under."""
    stack = [0]  # the weight inside each open bracket
    last_group = 0  # the weight of the group that just closed, if a count follows it
    after_group = False
    for match in _REPEAT_TOKENS.finditer(text):
        token = match.group()
        if token == "(":
            stack.append(0)
            after_group = False
        elif token == ")":
            last_group = stack.pop() if len(stack) > 1 else 0
            stack[-1] += last_group
            after_group = match.end() < len(text) and text[match.end()] == "{"
        else:
            low, high = _COUNT.fullmatch(token).groups()  # type: ignore[union-attr]
            count = max(int(low), int(high or 0))
            if after_group and text[match.start() - 1] == ")":
                stack[-1] += count * (1 + last_group) - last_group
            else:
                stack[-1] += count
            after_group = False
    return sum(stack)


def check_regex_repetition(text: str, max_repeat: int = MAX_REPEAT,
                           max_total: int = MAX_REPEAT_TOTAL) -> None:
    """Raise LimitExceeded when a regex of ``text`` repeats something more than
    ``max_repeat`` times (``{n}``, ``{n,}``, ``{n,m}``), its counted repetitions weigh
    more than ``max_total`` together (nested ones multiply), or a count hides in string
    escapes. Linear in the text."""
    for match in _COUNT.finditer(text):
        count = max(int(match.group(1)), int(match.group(2) or 0))
        if count > max_repeat:
            raise LimitExceeded(f"query repeats a regex part {count} times "
                                f"({match.group()}), more than the {max_repeat} allowed; "
                                "use + or * instead")
    escaped = _ESCAPED_COUNT.search(text)
    if escaped:
        raise LimitExceeded(f"query writes a digit, comma or brace as the escape "
                            f"{escaped.group()}; write the character itself")
    weight = repetition_weight(text)
    if weight > max_total:
        raise LimitExceeded(f"query's regex repetition counts add up to {weight} (nested "
                            f"ones multiply), more than the {max_total} allowed; use + or "
                            "* instead")
