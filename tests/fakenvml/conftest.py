"""Fixtures of the fake NVML's own tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakenvml import FakeNvml, fake_nvml_or_skip


@pytest.fixture
def fake(tmp_path: Path) -> FakeNvml:
    """A built fake NVML with its state file in the test's tmp dir."""
    return fake_nvml_or_skip(tmp_path / "nvml")
