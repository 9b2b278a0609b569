"""LiveWebConfig: re-read on change, keep the last good config on a broken file."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import bcrypt
import pytest

from slurm_gpu_exporter.web.config import WebConfigError
from slurm_gpu_exporter.web.reload import LiveWebConfig


def _users(password: str) -> str:
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()
    return f"basic_auth_users:\n  prom: '{hashed}'\n"


def _write(path: Path, text: str, mtime: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(mtime, mtime))  # a distinct mtime even within one clock tick


def test_unchanged_file_is_not_reread(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    _write(web, _users("a"), 1)
    live = LiveWebConfig(web)
    assert live.check() is False
    assert live.reloads == 0


def test_changed_file_is_reread_and_broken_one_reported_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    web = tmp_path / "web.yml"
    _write(web, _users("a"), 1)
    live = LiveWebConfig(web)
    first = live.current
    _write(web, _users("bb"), 2)
    assert live.check() is True
    assert live.current is not first and set(live.current.users) == {"prom"}
    good = live.current
    _write(web, "tls_server_config: [", 3)
    with caplog.at_level(logging.WARNING):
        assert live.check() is False
        assert live.check() is False
    assert live.current is good
    assert live.failures == 1
    assert sum("not re-read" in r.message for r in caplog.records) == 1


def test_missing_file_keeps_the_last_good(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    _write(web, _users("a"), 1)
    live = LiveWebConfig(web)
    good = live.current
    web.unlink()
    assert live.check() is False
    assert live.current is good and live.failures == 1


def test_a_broken_file_at_start_is_an_error(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("nope: 1\n")
    with pytest.raises(WebConfigError):
        LiveWebConfig(web)


# --- issue 19: edits during a read, loose modes, auth dropped -------------------------


def test_an_edit_made_while_the_file_is_read_is_read_at_the_next_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_gpu_exporter.web import reload as webreload

    web = tmp_path / "web.yml"
    _write(web, _users("a"), 1)
    live = LiveWebConfig(web)
    real_load = webreload.load_web_config
    third = _users("ccc") + "  other: '" + bcrypt.hashpw(b"x", bcrypt.gensalt(4)).decode() + "'\n"

    def load_then_edit(path: Path):  # type: ignore[no-untyped-def]
        config = real_load(path)
        if "other" not in path.read_text():
            _write(path, third, 3)  # config management writes again meanwhile
        return config

    monkeypatch.setattr(webreload, "load_web_config", load_then_edit)
    _write(web, _users("bb"), 2)
    assert live.check() is True  # read the second version
    assert "other" not in live.current.users
    assert live.check() is True  # and the third, written during that read
    assert "other" in live.current.users


def test_a_web_config_made_writable_by_others_is_warned(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    web = tmp_path / "web.yml"
    _write(web, _users("a"), 1)
    live = LiveWebConfig(web)
    web.chmod(0o666)
    _write(web, _users("bb"), 2)
    with caplog.at_level(logging.WARNING):
        live.check()
    assert "writable by group or others (mode 0666)" in caplog.text
    assert f"chmod go-w {web}" in caplog.text


def test_a_reread_that_drops_every_user_is_warned(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    web = tmp_path / "web.yml"
    _write(web, _users("a"), 1)
    live = LiveWebConfig(web)
    _write(web, "", 2)  # emptied: served without auth from now on
    with caplog.at_level(logging.WARNING):
        assert live.check() is True
    assert "served without a password" in caplog.text


def test_an_empty_web_config_at_start_is_warned(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    web = tmp_path / "web.yml"
    _write(web, "", 1)
    with caplog.at_level(logging.WARNING):
        LiveWebConfig(web)
    assert "sets neither TLS nor basic auth" in caplog.text
