"""Fixtures of the GPU tests."""

from __future__ import annotations

import pytest

from tests.gpu.fake_gpu import FakeBackend


@pytest.fixture
def backend() -> FakeBackend:
    """The small in-process fake backend: one GPU (tests/gpu/fake_gpu.py)."""
    return FakeBackend()
