"""Fixtures for tests against real components (the one-node Slurm cluster)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.slurmcluster import SlurmCluster, unavailable_reason
from tests.support import require


@pytest.fixture(scope="session")
def slurm_cluster(slurm_lock: None) -> Iterator[SlurmCluster]:
    """The real one-node Slurm cluster, up for the whole session.

    Started by this fixture when it is not running yet, and then stopped at the end;
    a cluster someone started by hand (`scripts/slurm-testcluster up`) is left running.
    """
    reason = unavailable_reason()
    require(reason is None, reason or "")
    cluster = SlurmCluster()
    started_here = not cluster.is_up()
    cluster.up()
    try:
        yield cluster
    finally:
        if started_here:
            cluster.down()
