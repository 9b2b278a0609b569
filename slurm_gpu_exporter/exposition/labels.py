"""Label values that come from users (job names, accounts, user names) kept safe to expose.

Any text a user chose can end up in a label: quotes, backslashes and newlines are
escaped by the client library's writers, but a lone surrogate (invalid UTF-8
decoded with ``surrogateescape`` or a ``\\udcff`` in JSON) would make encoding the
exposition fail, and a 10 KB job name would be copied into every scrape. So each
value is made valid UTF-8 (bad code points become U+FFFD) and cut to
``MAX_LABEL_VALUE_CHARS`` characters.
"""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

MAX_LABEL_VALUE_CHARS = 256


def bounded_label_value(value: str) -> str:
    """``value`` as valid UTF-8, at most MAX_LABEL_VALUE_CHARS characters."""
    if len(value) > MAX_LABEL_VALUE_CHARS:
        value = value[:MAX_LABEL_VALUE_CHARS]
    if value.isascii():
        return value
    return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in value)


def bound_label_values(family: Metric) -> Metric:
    """The family with every sample's label values bounded (in place; returned for chaining)."""
    family.samples = [
        s._replace(labels={k: bounded_label_value(v) for k, v in s.labels.items()})
        if any(len(v) > MAX_LABEL_VALUE_CHARS or not v.isascii() for v in s.labels.values())
        else s
        for s in family.samples
    ]
    return family
