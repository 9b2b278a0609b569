"""Helpers shared by the test suite."""

from __future__ import annotations

import os
import socket

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require(condition: bool, reason: str) -> None:
    """Skip when a real component is missing; under CI=true that is a failure instead."""
    if condition:
        return
    if in_ci():
        pytest.fail(f"required for this test and missing under CI: {reason}")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
