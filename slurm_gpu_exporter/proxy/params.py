"""Request parameters, read the same way whether they came in the URL or a POST form.

Prometheus (Go's ``Request.FormValue``) takes the first value of a parameter and lets
a POST body win over the URL. The proxy never guesses which one a store would read:
a parameter given twice, in any mix of URL and body, is refused, and what goes
upstream is a fresh form built from the parameters it checked.
"""

from __future__ import annotations

from aiohttp import web
from multidict import MultiDict

FORM = "application/x-www-form-urlencoded"
_NOT_UTF8 = "the {where} is not UTF-8 text; percent-encode every parameter's UTF-8 bytes"


class BadRequest(ValueError):
    """The request's parameters are malformed; the message says what to fix."""


async def read_params(request: web.Request) -> MultiDict[str]:
    """Every parameter of the URL and, for a POST, of its form body, in that order."""
    try:
        merged: MultiDict[str] = MultiDict(request.query)
    except UnicodeDecodeError:
        raise BadRequest(_NOT_UTF8.format(where="URL")) from None
    if request.method == "POST" and request.can_read_body:
        if request.content_type != FORM:
            raise BadRequest(f"a POST body must be {FORM}, not {request.content_type!r}")
        try:
            form = await request.post()
        except UnicodeDecodeError:  # a raw byte such as \xff: the client's error
            raise BadRequest(_NOT_UTF8.format(where="form body")) from None
        for name, value in form.items():
            if not isinstance(value, str):
                raise BadRequest(f"parameter {name} is not text")
            merged.add(name, value)
    return merged


def single(params: MultiDict[str], name: str, required: bool = False) -> str | None:
    """The one value of ``name``; BadRequest if it is given more than once (or missing
    when required)."""
    values = params.getall(name, [])
    if len(values) > 1:
        raise BadRequest(f"parameter {name} is given {len(values)} times; give it once")
    if not values:
        if required:
            raise BadRequest(f"parameter {name} is missing")
        return None
    return values[0]


def pick(params: MultiDict[str], names: tuple[str, ...]) -> list[tuple[str, str]]:
    """The single-valued parameters among ``names`` that are present, checked."""
    out = []
    for name in names:
        value = single(params, name)
        if value is not None:
            out.append((name, value))
    return out
