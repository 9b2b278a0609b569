"""Fixtures of the report tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import free_port


@pytest.fixture
def smtp_inbox() -> Iterator[tuple[str, list[bytes]]]:
    """A real SMTP server (aiosmtpd) on 127.0.0.1: its URL and the raw mails it got."""
    from aiosmtpd.controller import Controller

    inbox: list[bytes] = []

    class Handler:
        async def handle_DATA(self, server, session, envelope):  # type: ignore[no-untyped-def]
            inbox.append(envelope.content)
            return "250 OK"

    controller = Controller(Handler(), hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        yield f"smtp://127.0.0.1:{controller.port}", inbox
    finally:
        controller.stop()
