"""Serving until told to stop: SIGTERM or SIGINT stop a server, SIGHUP (where the
server takes it) asks it to re-read its configuration."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@asynccontextmanager
async def stop_signals(on_hup: Callable[[], None] | None = None,
                       stop_after: float | None = None) -> AsyncIterator[asyncio.Event]:
    """An event set by SIGTERM or SIGINT (or ``stop_after`` seconds from now), for the
    server to wait on and then shut down; ``on_hup`` is called at each SIGHUP. The
    signals are the server's from entering the block, so one that comes while it
    starts is not lost; leaving it gives them back."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    handled = [*STOP_SIGNALS, *([signal.SIGHUP] if on_hup is not None else [])]
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    if on_hup is not None:
        loop.add_signal_handler(signal.SIGHUP, on_hup)
    timer = loop.call_later(stop_after, stop.set) if stop_after is not None else None
    try:
        yield stop
    finally:
        if timer is not None:
            timer.cancel()
        for sig in handled:
            loop.remove_signal_handler(sig)
