"""The state dir against links: the trust check follows the real path, and no link
under the state dir makes the root agent write or read elsewhere."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_gpu_exporter.agent.trust import UntrustedPathError, check_private_dir
from slurm_gpu_exporter.node.state_dir import STATE_FILE, StateStore
from tests.support import require

NOBODY = 65534


def test_a_state_dir_reached_through_a_link_is_checked_along_its_target(tmp_path: Path) -> None:
    # /base/link -> /base/users/state: "users" belongs to a user, who could swap
    # "state" for a directory of their own after the check.
    require(os.geteuid() == 0, "giving a directory to another user needs root")
    users = tmp_path / "users"
    (users / "state").mkdir(parents=True)
    os.chown(users, NOBODY, NOBODY)
    link = tmp_path / "link"
    link.symlink_to(users / "state")
    with pytest.raises(UntrustedPathError, match=rf"{users} \(where {link} leads\) belongs to"):
        check_private_dir(link, "--state-dir", frozenset({0}))
    check_private_dir(tmp_path, "--state-dir", frozenset({0}))  # the rest is fine


def test_a_link_planted_as_the_temp_file_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "shadow"
    victim.write_text("root:secret\n")
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / f".{STATE_FILE}.{os.getpid()}.tmp").symlink_to(victim)
    store = StateStore(state_dir)
    assert store.save({"jobs": {"7": {"cpu_seconds": 1.0}}})
    assert victim.read_text() == "root:secret\n"
    saved = state_dir / STATE_FILE
    assert not saved.is_symlink() and json.loads(saved.read_text())["jobs"] == {
        "7": {"cpu_seconds": 1.0}}
    assert saved.stat().st_mode & 0o777 == 0o600  # it names users: owner-only
    assert sorted(p.name for p in state_dir.iterdir()) == [STATE_FILE]


def test_a_link_in_place_of_the_state_file_is_not_read_and_is_moved_aside(
        tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"version": 1, "jobs": {"7": {"cpu_seconds": 99.0}}}')
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / STATE_FILE).symlink_to(elsewhere)
    assert StateStore(state_dir).load() == {}
    assert [p.name.split("-")[0] for p in state_dir.iterdir()] == [f"{STATE_FILE}.corrupt"]
    assert elsewhere.exists()
