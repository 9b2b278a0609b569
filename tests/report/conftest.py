"""Fixtures of the report tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.report.pgserver import PostgresServer
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


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One real PostgreSQL for the session (databases are made per test)."""
    server = PostgresServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.process)])
def archive_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty job archive: an SQLite file, or a new database on the real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'archive.sqlite'}"
    server = request.getfixturevalue("postgres_server")
    return server.create_database(f"archive_{uuid.uuid4().hex[:12]}")
