"""Hypothesis budgets: "ci" (default, small and derandomized) and "long" (by hand).

    HYPOTHESIS_PROFILE=long .venv/bin/pytest tests/system/fuzz
"""

from __future__ import annotations

import os
import shutil
from datetime import timedelta

from hypothesis import HealthCheck, settings

_COMMON = {
    # A parser that hangs shows up as an example over this, not as a stuck suite.
    "deadline": timedelta(seconds=5),
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
}
settings.register_profile("ci", max_examples=150, derandomize=True, **_COMMON)
settings.register_profile("long", max_examples=20_000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_sessionfinish() -> None:
    from tests.system.fuzz.test_fuzz_parsers import _LAYOUT_COPIES

    for root in _LAYOUT_COPIES.values():
        shutil.rmtree(root.parent, ignore_errors=True)
