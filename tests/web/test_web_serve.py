"""What every server shares besides its listener: stopping on SIGTERM/SIGINT with SIGHUP
handed to the server (web/serve.py), and the one logging set-up (web/logging_setup.py).
Signals are sent to this process for real, only while the handlers are installed."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from slurm_gpu_exporter.web.logging_setup import level_number, setup_logging
from slurm_gpu_exporter.web.serve import stop_signals


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_sigint_stops_and_a_sighup_only_calls_back(sig: signal.Signals) -> None:
    async def run() -> tuple[bool, list[int], bool]:
        hups: list[int] = []
        async with stop_signals(on_hup=lambda: hups.append(1)) as stop:
            os.kill(os.getpid(), signal.SIGHUP)
            await asyncio.sleep(0.05)
            stopped_by_hup = stop.is_set()
            os.kill(os.getpid(), sig)
            await asyncio.wait_for(stop.wait(), 5)
        return stopped_by_hup, hups, stop.is_set()

    # Should the server's SIGHUP handler be missing, the signal must not end the tests.
    previous = signal.signal(signal.SIGHUP, lambda *_: None)
    try:
        stopped_by_hup, hups, stopped = asyncio.run(run())
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert not stopped_by_hup and hups == [1] and stopped


def test_stop_after_stops_without_a_signal_and_the_handlers_are_given_back() -> None:
    async def run() -> bool:
        async with stop_signals(stop_after=0.05) as stop:
            await asyncio.wait_for(stop.wait(), 5)
        # Given back: installing another handler for the same signal is not shadowed.
        loop = asyncio.get_running_loop()
        return loop.remove_signal_handler(signal.SIGTERM)

    assert asyncio.run(run()) is False


def test_levels_are_the_flags_names() -> None:
    assert [level_number(n) for n in ("debug", "info", "warn", "error")] == [
        logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR]


def test_without_a_format_only_the_packages_level_is_set() -> None:
    package = logging.getLogger("slurm_gpu_exporter")
    root_handlers = list(logging.getLogger().handlers)
    before = package.level
    try:
        setup_logging("info")
        assert package.level == logging.INFO
        assert logging.getLogger().handlers == root_handlers  # the command's own stay
    finally:
        package.setLevel(before)
