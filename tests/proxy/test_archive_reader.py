"""The archive reader on a real SQLite archive in process: the jobs of an id across
clusters and in one, with who owns each and when it was archived; an archive it cannot
read; a config's own prometheus_url; `or` between matchers; a checker that cannot be
started again at once."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from slurm_gpu_exporter.proxy.archive import ArchiveReader, ArchiveUnavailable
from slurm_gpu_exporter.proxy.config import load_config
from slurm_gpu_exporter.proxy.query.check_pool import CheckPool
from slurm_gpu_exporter.proxy.query.restrict import QueryRefused, Scope, restrict_query
from slurm_gpu_exporter.report.archive.store import ArchiveStore
from tests.proxy.test_checkers_in_process import ALICE, Worker
from tests.report.archive.archive_data import NOV_1, record


def test_the_reader_finds_a_jobs_runs_by_cluster_with_owner_and_archive_time(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/archive.db"
    with ArchiveStore(url, write=True) as store:
        store.store([record("7", user="alice", cluster="east"),
                     record("7", user="bob", cluster="west"),
                     record("8", user="alice", cluster="east")], archived_at=NOV_1 + 90_000)
    reader = ArchiveReader(url)
    found = asyncio.run(reader.job("7", None))
    assert sorted((j.user, j.cluster, j.archived_at) for j in found) == [
        ("alice", "east", NOV_1 + 90_000), ("bob", "west", NOV_1 + 90_000)]
    assert {j.detail["usage"]["user"] for j in found} == {"alice", "bob"}
    assert {j.detail["usage"]["jobid"] for j in found} == {"7"}
    [west] = asyncio.run(reader.job("7", "west"))
    assert (west.user, west.cluster) == ("bob", "west")
    assert asyncio.run(reader.job("9", None)) == []


def test_an_archive_that_cannot_be_read_is_unavailable_with_the_reason(
        tmp_path: Path) -> None:
    path = tmp_path / "archive.db"
    path.write_bytes(b"not a database at all" * 100)
    reader = ArchiveReader(f"sqlite:///{path}")
    with pytest.raises(ArchiveUnavailable) as caught:
        asyncio.run(reader.job("7", None))
    assert str(caught.value) not in ("", "None")
    assert reader.check() not in (None, "", "None")


def test_the_config_files_prometheus_url_is_taken(tmp_path: Path) -> None:
    config = tmp_path / "proxy.yml"
    config.write_text("prometheus_url: http://store:9090/\n")
    assert load_config(config, None, [], []).prometheus_url == "http://store:9090"
    assert load_config(config, "http://other:9090", [], []).prometheus_url == (
        "http://other:9090")


def test_or_between_matchers_is_refused() -> None:
    with pytest.raises(QueryRefused) as caught:
        restrict_query('up{job="a" or job="b"}', Scope(admin=False, users=frozenset({"u"})))
    assert str(caught.value) == "`or` between matchers in one selector is not supported"


def test_a_checker_that_cannot_start_again_is_retried_and_said_so(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> str:
        pool = CheckPool(time_limit=0.05)
        slow = Worker(delay=1.0)
        pool._idle.append(slow)  # type: ignore[arg-type]
        tries: list[int] = []

        async def spawn() -> Worker:
            tries.append(1)
            if len(tries) == 1:
                raise OSError("[Errno 11] Resource temporarily unavailable")
            return Worker()

        monkeypatch.setattr(pool, "_spawn", spawn)
        with pytest.raises(QueryRefused):
            await pool.check("query", "up", ALICE)
        await asyncio.gather(*pool._replacing)
        return await pool.check("query", "up", ALICE)

    with caplog.at_level(logging.WARNING):
        assert asyncio.run(run()) == '{__name__="up",user="alice"}'
    assert "cannot start a query checker ([Errno 11] Resource temporarily unavailable); " \
           "retrying in 1 s" in caplog.messages
