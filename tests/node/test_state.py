"""The state dir: saved atomically, read back, bad files moved aside, write errors raised."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from slurm_gpu_exporter.node.state_dir import STATE_FILE, STATE_VERSION, StateStore


def test_nothing_saved_yet_loads_as_empty(tmp_path: Path) -> None:
    assert StateStore(tmp_path / "missing").load() == {}


def test_saved_state_is_read_back_and_the_directory_is_made(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "a" / "state")
    store.save({"jobs": {"42": {"cpu": 1.5}}})
    assert store.load() == {"jobs": {"42": {"cpu": 1.5}}, "version": STATE_VERSION}
    store.save({"jobs": {}})
    assert store.load()["jobs"] == {}
    assert sorted(p.name for p in store.state_dir.iterdir()) == [STATE_FILE]


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'{"version": 99}'])
def test_an_unusable_state_file_is_moved_aside_not_deleted(
        tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture) -> None:
    store = StateStore(tmp_path)
    store.path.write_bytes(content)
    with caplog.at_level(logging.WARNING):
        assert store.load() == {}
    aside = list(tmp_path.glob(f"{STATE_FILE}.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == content
    assert not store.path.exists()
    assert "starting fresh" in caplog.text


def test_an_unreadable_state_file_starts_fresh_and_is_left_alone(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = StateStore(tmp_path)
    store.path.mkdir()  # reading a directory fails the same way for root and users
    with caplog.at_level(logging.WARNING):
        assert store.load() == {}
    assert store.path.is_dir()
    assert "cannot read state file" in caplog.text


def test_a_state_dir_that_cannot_be_written_raises_and_leaves_no_temporary_file(
        tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        StateStore(blocker / "state").save({"jobs": {}})
    store = StateStore(tmp_path / "state")
    store.save({"jobs": {"1": {}}})
    store.path.unlink()
    store.path.mkdir()  # the final rename onto a directory fails after the write
    with pytest.raises(OSError):
        store.save({"jobs": {}})
    assert [p.name for p in store.state_dir.iterdir()] == [STATE_FILE]


def test_the_saved_file_is_plain_json_with_a_version(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save({"gpu": {"x": 1}})
    assert json.loads(store.path.read_text()) == {"gpu": {"x": 1}, "version": STATE_VERSION}


def test_saving_what_was_last_saved_writes_nothing(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    assert store.save({"jobs": {"42": {"cpu": 1.5}}}) is True
    inode = store.path.stat().st_ino  # each write replaces the file: a new inode
    assert store.save({"jobs": {"42": {"cpu": 1.5}}}) is False
    assert store.path.stat().st_ino == inode
    assert store.save({"jobs": {"42": {"cpu": 2.0}}}) is True
    assert store.path.stat().st_ino != inode


def test_a_state_file_removed_behind_the_agents_back_is_written_again(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save({"jobs": {}})
    store.path.unlink()
    assert store.save({"jobs": {}}) is True
    assert store.load() == {"jobs": {}, "version": STATE_VERSION}


def test_after_a_failed_save_the_same_state_is_tried_again(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    store = StateStore(blocker / "state")
    with pytest.raises(OSError):
        store.save({"jobs": {}})
    blocker.unlink()
    assert store.save({"jobs": {}}) is True
    assert store.load()["jobs"] == {}


def test_every_changed_state_is_renamed_into_place_and_fsynced_at_most_once_a_minute(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    now = [100.0]
    store = StateStore(tmp_path / "state", clock=lambda: now[0])
    assert store.save({"jobs": {"1": {"n": 0}}})
    assert len(synced) == 2  # the first save: the file, then the directory
    for n in range(1, 12):  # a sample every 5 s for 55 s
        now[0] += 5
        assert store.save({"jobs": {"1": {"n": n}}})
        assert StateStore(tmp_path / "state").load()["jobs"] == {"1": {"n": n}}
    assert len(synced) == 2
    now[0] += 5  # 60 s after the last fsync
    assert store.save({"jobs": {"1": {"n": 12}}})
    assert len(synced) == 4
    assert not [p for p in (tmp_path / "state").iterdir() if p.name != STATE_FILE]


def test_a_change_of_the_cursors_alone_waits_the_hold_anything_else_is_written_at_once(
        tmp_path: Path) -> None:
    # Idle GPUs that keep sampling move their sample cursors every sample and nothing
    # else: the file is rewritten at most every hold_s seconds for that.
    now = [100.0]
    store = StateStore(tmp_path / "state", clock=lambda: now[0])

    def state(cursor: int, busy: float) -> tuple[dict, tuple[str, str]]:  # type: ignore[type-arg]
        data = {"jobs": {"9": [1, "x"]}, "gpu": {"sample_cursors": {"g": cursor}, "busy": busy}}
        return data, ("gpu", "sample_cursors")

    def on_disk() -> dict:  # type: ignore[type-arg]
        return json.loads((tmp_path / "state" / STATE_FILE).read_text())["gpu"]

    assert store.save(*state(1, 0.0), hold_s=10.0)
    now[0] += 5
    assert not store.save(*state(2, 0.0), hold_s=10.0)
    assert on_disk()["sample_cursors"] == {"g": 1}
    now[0] += 5
    assert store.save(*state(3, 0.0), hold_s=10.0)  # the hold is over
    assert on_disk()["sample_cursors"] == {"g": 3}
    now[0] += 1
    assert store.save(*state(4, 2.5), hold_s=10.0)  # a counter moved: written at once
    assert on_disk() == {"sample_cursors": {"g": 4}, "busy": 2.5}
    # Byte for byte what one json.dumps writes, whatever was held.
    assert (tmp_path / "state" / STATE_FILE).read_text() == json.dumps(
        {**state(4, 2.5)[0], "version": STATE_VERSION}, separators=(",", ":"))
    now[0] += 1
    assert store.save(*state(5, 2.5))  # no hold given: every change is written
    now[0] += 11
    assert store.save(*state(6, 2.5), hold_s=10.0)
    (tmp_path / "state" / STATE_FILE).unlink()
    now[0] += 1
    assert store.save(*state(7, 2.5), hold_s=10.0)  # a file gone is written at once
    assert on_disk()["sample_cursors"] == {"g": 7}


def test_an_unchanged_state_is_compared_not_serialized(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An idle node's sample: the same state (or one whose held cursors alone moved)
    # costs a comparison of objects, no JSON; any change is still written.
    from slurm_gpu_exporter.node import state_dir

    calls: list[int] = []
    real = state_dir._serialized
    monkeypatch.setattr(state_dir, "_serialized",
                        lambda *a: (calls.append(1), real(*a))[1])
    now = [100.0]
    store = StateStore(tmp_path, clock=lambda: now[0])
    lazy = ("gpu", "sample_cursors")

    def state(cursor: int, busy: float) -> dict:  # type: ignore[type-arg]
        return {"jobs": {"9": [1, "x"]}, "gpu": {"sample_cursors": {"g": cursor}, "busy": busy}}

    assert store.save(state(1, 0.0), lazy, 10.0)
    assert len(calls) == 1
    now[0] += 5
    assert not store.save(state(1, 0.0))  # the same, no hold given
    assert not store.save(state(2, 0.0), lazy, 10.0)  # the cursors alone, within the hold
    assert len(calls) == 1
    assert store.save(state(2, 1.0), lazy, 10.0)  # a counter moved
    assert len(calls) == 2
    assert json.loads(store.path.read_text())["gpu"] == {"sample_cursors": {"g": 2}, "busy": 1.0}
    now[0] += 11
    assert store.save(state(3, 1.0), lazy, 10.0)  # the hold is over
    assert json.loads(store.path.read_text())["gpu"]["sample_cursors"] == {"g": 3}


def test_a_state_json_reads_back_otherwise_is_still_compared_by_its_json(
        tmp_path: Path) -> None:
    # A tuple reads back as a list: the objects differ, the JSON is the same, nothing written.
    store = StateStore(tmp_path)
    assert store.save({"gpu": {"t": (1, 2)}})
    inode = store.path.stat().st_ino
    assert not store.save({"gpu": {"t": (1, 2)}})
    assert store.path.stat().st_ino == inode
    assert store.save({"gpu": {"t": (1, 3)}})


def test_while_every_save_writes_the_state_is_not_read_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Jobs running: the state changes every sample and is written every sample; reading
    # each save back for the comparison would only add to that sample's cost.
    loads: list[int] = []
    real = json.loads
    monkeypatch.setattr(json, "loads", lambda *a, **k: (loads.append(1), real(*a, **k))[1])
    store = StateStore(tmp_path)
    for n in range(5):
        assert store.save({"jobs": {"1": {"n": n}}})
    assert len(loads) == 1  # the first save: it may be followed by unchanged ones
    assert not store.save({"jobs": {"1": {"n": 4}}})  # unchanged: now read back, once
    assert not store.save({"jobs": {"1": {"n": 4}}})
    assert len(loads) == 2
    assert store.save({"jobs": {"1": {"n": 5}}})
    assert len(loads) == 3
