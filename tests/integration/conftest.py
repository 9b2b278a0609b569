"""Fixtures for tests against real components (the one-node Slurm cluster)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.integration.slurmcluster import SlurmCluster, unavailable_reason


def _skip_or_fail(reason: str) -> None:
    """Skip, except under CI=true where a missing real component is a failure."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The real one-node Slurm cluster, up for the whole session.

    Started by this fixture when it is not running yet, and then stopped at the end;
    a cluster someone started by hand (`scripts/slurm-testcluster up`) is left running.
    """
    reason = unavailable_reason()
    if reason is not None:
        _skip_or_fail(reason)
    cluster = SlurmCluster()
    started_here = not cluster.is_up()
    cluster.up()
    try:
        yield cluster
    finally:
        if started_here:
            cluster.down()
