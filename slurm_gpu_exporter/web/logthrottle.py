"""At most one log line a minute per message, for the messages a remote client can
trigger at will (asyncio's accept errors, aiohttp's bad-request lines): thousands of
them would otherwise fill the disk."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

# Loggers whose records a client can cause: the event loop's, aiohttp's server side.
CLIENT_DRIVEN_LOGGERS = ("asyncio", "aiohttp.server", "aiohttp.web", "aiohttp.internal")


class RepeatFilter(logging.Filter):
    """Lets one record per (logger, message template) through every ``interval`` seconds;
    the next one let through says how many were held back."""

    def __init__(self, interval: float = 60.0, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        super().__init__()
        self.interval = interval
        self._clock = clock
        self._last: dict[tuple[str, str], tuple[float, int]] = {}  # -> (let through, held)

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last[0] < self.interval:
            self._last[key] = (last[0], last[1] + 1)
            return False
        if last is not None and last[1]:
            record.msg = f"{record.msg} ({last[1]} more like this in the last "
            record.msg += f"{now - last[0]:.0f} s not logged)"
        if len(self._last) > 1000:  # templates are few; this only bounds odd cases
            self._last.clear()
        self._last[key] = (now, 0)
        return True


def throttle_client_driven_logs(interval: float = 60.0) -> None:
    """Install a RepeatFilter on each of CLIENT_DRIVEN_LOGGERS."""
    for name in CLIENT_DRIVEN_LOGGERS:
        logging.getLogger(name).addFilter(RepeatFilter(interval))
