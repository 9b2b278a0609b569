"""When to try a query again: the server said it is busy (HTTP 503 or 429).

A busy answer is a normal outcome of a loaded store (VictoriaMetrics answers 503 to a
query that waited ``-search.maxQueueDuration`` for a slot; slurm-gpu-proxy answers 503
``auth_busy`` in a password-check flood; gateways answer 429). The query is tried again
a bounded number of times, after the server's ``Retry-After`` where it sends one, else
after a growing pause; then the caller gets one clear error. Pure: no I/O, no clock.
"""

from __future__ import annotations

import email.utils
import math
from dataclasses import dataclass
from datetime import UTC

BUSY_STATUSES = frozenset({429, 503})
DEFAULT_RETRIES = 3
DEFAULT_MAX_CONCURRENT = 4


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to wait for a busy server."""

    retries: int = DEFAULT_RETRIES  # tries after the first
    first_pause_s: float = 0.5
    max_pause_s: float = 30.0  # a Retry-After longer than this is cut to it

    def pause(self, retry: int, retry_after: str | None, now: float) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first retry)."""
        asked = retry_after_seconds(retry_after, now)
        pause = asked if asked is not None else self.first_pause_s * 2 ** (retry - 1)
        return min(pause, self.max_pause_s)


def retry_after_seconds(header: str | None, now: float) -> float | None:
    """A ``Retry-After`` header as seconds from ``now``: delay-seconds or an HTTP date;
    None when absent or unreadable (the caller's own pause applies)."""
    if header is None:
        return None
    text = header.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000": an HTTP date is GMT whatever it says
        when = when.replace(tzinfo=UTC)
    seconds = when.timestamp() - now
    return max(0.0, seconds) if math.isfinite(seconds) else None


def is_busy(status: int) -> bool:
    """A status that means: the server is overloaded now, the query may be tried again."""
    return status in BUSY_STATUSES
