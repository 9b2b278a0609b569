"""JSON for spool records without importing the ``json`` package in the prolog.

``json`` imports ``re`` (and through it ``enum``, ``functools``, ``collections``), a good
part of a prolog's start-up. The C half of ``json`` (``_json``) needs none of that; this
module calls it for what records hold (a flat object of strings, ints, floats and None)
and gives exactly ``json.dumps(data, sort_keys=True)`` and ``json.loads(raw)``. Anything
else (a value of another type, bytes that are not a plain UTF-8 object, any error) goes
to the ``json`` package itself, so odd input gets its answers and its error messages.

Standard library only.
"""

from __future__ import annotations

try:
    import _json
except ImportError:  # not CPython: the json package does it all
    _json = None  # type: ignore[assignment]

__all__ = ["dumps_object", "loads_object"]

_WHITESPACE = " \t\n\r"  # what JSON allows around a value (json.decoder's WHITESPACE)
_INFINITY = float("inf")


class _DecoderContext:
    """What json.JSONDecoder() hands the C scanner: the defaults of json.loads."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": -_INFINITY, "Infinity": _INFINITY,
                      "NaN": float("nan")}.__getitem__
    memo: dict[str, str] = {}


_scan = _json.make_scanner(_DecoderContext()) if _json is not None else None


def _number(value: float) -> str:
    """A float as json.dumps writes it (its ``floatstr`` with ``allow_nan``)."""
    if value != value:
        return "NaN"
    if value == _INFINITY:
        return "Infinity"
    if value == -_INFINITY:
        return "-Infinity"
    return float.__repr__(value)


def _scalar(value: object) -> str | None:
    """One value as json.dumps writes it, or None for a type not handled here."""
    if isinstance(value, str):
        return _json.encode_basestring_ascii(value)  # type: ignore[union-attr]
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return _number(value)
    return None


def dumps_object(data: dict[str, object]) -> bytes:
    """``json.dumps(data, sort_keys=True)`` and a newline, encoded: a spool record's
    bytes."""
    if _json is not None and all(isinstance(key, str) for key in data):
        parts = []
        for key in sorted(data):
            text = _scalar(data[key])
            if text is None:
                break
            parts.append(f"{_json.encode_basestring_ascii(key)}: {text}")
        else:
            return ("{" + ", ".join(parts) + "}\n").encode()
    import json  # only for values a record never holds
    return (json.dumps(data, sort_keys=True) + "\n").encode()


def loads_object(raw: bytes) -> object:
    """``json.loads(raw)``: the same value, or the same exception."""
    # Bytes that start '{"' are UTF-8 to json.loads (no byte order mark, no NUL in the
    # first two bytes); a strict decode that succeeds gives what its 'surrogatepass' does.
    if _scan is not None and raw[:2] == b'{"':
        try:
            text = raw.decode("utf-8")
            value, end = _scan(text, 0)
        except Exception:  # json.loads below says what is wrong
            pass
        else:
            if not text[end:].strip(_WHITESPACE):
                return value
    import json
    return json.loads(raw)
