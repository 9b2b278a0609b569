"""Test tiers: a test that starts a process is marked ``process``, and the mark is enforced.

``pytest -m "not process"`` is the fast tier. A test outside ``process`` that starts a
process (subprocess, asyncio subprocess, fork) fails at once, naming the marker it
lacks, so the fast tier stays free of processes and the marker stays true.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from tests.support import require
from tests.support.slurmcluster import RELEASES, SlurmCluster, host_release, unavailable_reason

# Markers that name a real component: each means the test starts that component.
COMPONENT_MARKERS = ("slurm", "prometheus", "fakenvml", "mlflow")
# Fixtures that start processes or daemons for the tests that use them.
PROCESS_FIXTURES = frozenset({"slurm_cluster", "stack", "senders"})


# Node-wide resources, each used by one test at a time: the one Slurm cluster, and
# what the Ansible role writes (/opt, /etc). Each has its group, which runs on one
# worker when the suite runs in parallel (pytest-xdist); the two groups overlap.
SLURM_FIXTURES = frozenset({"slurm_cluster", "slurm_lock"})


# A unix socket's path holds 107 bytes, and tests bind sockets in their temp dirs
# (tmp_path, tempfile.mkdtemp), up to about 87 bytes below it (pytest-of-USER/pytest-N/
# a test's dir/node/spool/.training.PID.sock). Under a longer TMPDIR they would fail.
MAX_TEMP_DIR = 20


def pytest_configure(config: pytest.Config) -> None:
    """Where the temp dir is too long for the sockets under it, use /tmp (before xdist
    starts its workers, which inherit it)."""
    temp = tempfile.gettempdir()
    if len(os.fsencode(temp)) <= MAX_TEMP_DIR or not os.access("/tmp", os.W_OK | os.X_OK):
        return
    os.environ["TMPDIR"] = "/tmp"
    tempfile.tempdir = None  # gettempdir() looks again
    if not hasattr(config, "workerinput"):
        sys.stderr.write(f"the temp dir {temp} is too long for unix socket paths under it "
                         f"({len(temp)} > {MAX_TEMP_DIR} bytes): the tests use /tmp\n")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups: dict[pytest.Item, str] = {}
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if any(item.get_closest_marker(m) for m in COMPONENT_MARKERS) or (
            fixtures & PROCESS_FIXTURES
        ):
            item.add_marker(pytest.mark.process)
        if item.get_closest_marker("process") is None:
            continue  # the fast tier: spread test by test
        path = item.nodeid.split("::")[0]
        if item.get_closest_marker("slurm") or fixtures & SLURM_FIXTURES:
            group = "slurm"
        elif "etc_lock" in fixtures:
            group = "etc"
        elif "stack" in fixtures:
            group = "observe-stack"  # one Prometheus/Alertmanager stack per session
        else:
            group = path  # a module's shared daemons start once, on one worker
        item.add_marker(pytest.mark.xdist_group(group))
        groups[item] = group
    workers = getattr(config, "workerinput", {}).get("workercount")
    if workers:
        items[:] = scheduled(items, groups, workers)


# The groups that take longest, first: each runs on one worker from the start, and the
# slurm chain is the suite's floor (about 7 minutes of its 8 on 2 cores).
LONGEST_FIRST = ("slurm", "etc")


def scheduled(items: list[pytest.Item], groups: dict[pytest.Item, str],
              workers: int) -> list[pytest.Item]:
    """The items in the order pytest-xdist hands their groups out (scripts/test runs it
    with --no-loadscope-reorder): the longest groups first, then the other groups of
    process tests, most tests first, then the fast tier, test by test. xdist gives every
    worker two units at the start, so the first worker's second unit waits behind the
    first one: a test of the fast tier is put there, and behind the etc group, so no
    long group waits behind the slurm chain."""
    members: dict[str, list[pytest.Item]] = {}
    for item in items:
        members.setdefault(groups.get(item, item.nodeid), []).append(item)
    if "slurm" in members:  # one release after another: each switch restarts the cluster
        order = {r: i for i, r in enumerate(releases_to_run())}
        members["slurm"].sort(key=lambda item: order.get(_release_of(item), -1))
    named = set(groups.values())
    long = [g for g in LONGEST_FIRST if g in members]
    others = sorted((g for g in members if g in named and g not in long),
                    key=lambda g: -len(members[g]))
    fast = [g for g in members if g not in named]
    first = long + others[:max(0, workers - len(long))]
    fillers, fast = fast[:len(long)], fast[len(long):]
    order = first + fillers + others[len(first) - len(long):] + fast
    return [item for g in order for item in members[g]]


def _release_of(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("slurm_cluster") if callspec is not None else None


# One user at a time per machine, whichever checkout the tests run from: the Slurm
# cluster (fixed node name, ports, spool), and what the Ansible role writes.
SLURM_LOCK = "/var/tmp/sge-testcluster.lock"
ETC_LOCK = "/var/tmp/sge-etc.lock"


def _held(path: str) -> Iterator[None]:
    with open(path, "w") as lock:  # not inherited by the daemons tests start
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def slurm_lock() -> Iterator[None]:
    """Held while a session uses the Slurm cluster; another test run waits."""
    yield from _held(SLURM_LOCK)


@pytest.fixture(scope="session")
def etc_lock() -> Iterator[None]:
    """Held while a session applies the Ansible role to this machine (/opt, /etc)."""
    yield from _held(ETC_LOCK)


@pytest.fixture(autouse=True)
def _processes_only_where_marked(request: pytest.FixtureRequest,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("process") is not None:
        return
    message = (f"{request.node.nodeid} starts a process: mark it pytest.mark.process "
               "(the fast tier, -m 'not process', starts none)")

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(message)

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(os, "fork", refuse)


def releases_to_run() -> tuple[str, ...]:
    """The Slurm releases the tests marked ``every_release`` run on: $SGE_SLURM_RELEASES
    (comma-separated), else all of them. The host's own comes first."""
    wanted = os.environ.get("SGE_SLURM_RELEASES", "").replace(" ", "")
    chosen = tuple(r for r in wanted.split(",") if r) if wanted else RELEASES
    unknown = [r for r in chosen if r not in RELEASES]
    if unknown:
        raise pytest.UsageError(f"SGE_SLURM_RELEASES: unknown release {', '.join(unknown)} "
                                f"(known: {', '.join(RELEASES)})")
    host = _host_release()
    return tuple(sorted(chosen, key=lambda r: r != host))


def _host_release() -> str:
    """The host's own release, where the other tests of Slurm run (22.05 when the host
    has no Slurm: those tests then skip, or fail under CI)."""
    return host_release() or "22.05"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests of what Slurm says or does (mark ``every_release``) run once per release
    (``every_release("25.11")``: on those named only); the other tests that use the
    cluster run on the host's release only. Every use is parametrized, so one release's
    cluster is one fixture instance."""
    if "slurm_cluster" not in metafunc.fixturenames:
        return
    every = metafunc.definition.get_closest_marker("every_release")
    if metafunc.definition.get_closest_marker("host_release") is not None:
        every = None  # in a module of every release, a test of our own logic
    releases = releases_to_run() if every else (_host_release(),)
    if every is not None and every.args:  # every_release("25.11"): those releases only
        releases = tuple(r for r in releases if r in every.args)
    metafunc.parametrize("slurm_cluster", releases, indirect=True, scope="session",
                         ids=[f"slurm{r}" for r in releases])


@pytest.fixture(scope="session")
def slurm_cluster(request: pytest.FixtureRequest, slurm_lock: None) -> Iterator[SlurmCluster]:
    """The real one-node Slurm cluster of one release, up while its tests run.

    Started by this fixture when it is not running yet, and then stopped when the tests
    move on to another release or end; a cluster someone started by hand
    (`scripts/slurm-testcluster up`) is left running.
    """
    release = getattr(request, "param", None)
    reason = unavailable_reason(release)
    require(reason is None, reason or "")
    cluster = SlurmCluster(release=release)
    started_here = not cluster.is_up()
    cluster.up()
    try:
        yield cluster
    finally:
        if started_here:
            cluster.down()
