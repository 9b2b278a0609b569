"""The role's tests write /opt and /etc: one test run at a time on a machine."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _node_wide(etc_lock: None) -> None:
    """Every test here waits for the lock on /opt and /etc (see tests/conftest.py)."""
