"""Start-up trust checks: the spool and state dirs, and the web config's readability."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from slurm_gpu_exporter.agent import cli
from slurm_gpu_exporter.agent.trust import (
    UntrustedPathError,
    check_private_dir,
    warn_if_web_config_exposed,
)
from slurm_gpu_exporter.web.config import WebConfig
from tests.support import require

TRUSTED = frozenset({0, os.geteuid()})


def _dir(path: Path, mode: int) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(mode)
    return path


def test_a_private_dir_passes_and_a_missing_one_too(tmp_path: Path) -> None:
    check_private_dir(_dir(tmp_path / "spool", 0o755), "--spool-dir", TRUSTED)
    check_private_dir(tmp_path / "not-yet", "--state-dir", TRUSTED)
    (tmp_path / "file").write_text("")
    check_private_dir(tmp_path / "file" / "state", "--state-dir", TRUSTED)  # saving reports it


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777, 0o1777])
def test_a_dir_writable_by_others_is_refused_with_the_fix(tmp_path: Path, mode: int) -> None:
    spool = _dir(tmp_path / "spool", mode)
    with pytest.raises(UntrustedPathError, match=f"fix: chmod go-w {spool}$"):
        check_private_dir(spool, "--spool-dir", TRUSTED)


def test_a_loose_parent_is_refused_unless_sticky(tmp_path: Path) -> None:
    parent = _dir(tmp_path / "parent", 0o777)
    state = _dir(parent / "state", 0o755)
    with pytest.raises(UntrustedPathError, match=f"{parent} is writable"):
        check_private_dir(state, "--state-dir", TRUSTED)
    parent.chmod(0o1777)  # like /tmp: others cannot rename what they do not own
    check_private_dir(state, "--state-dir", TRUSTED)


def test_a_dir_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    require(os.geteuid() == 0, "changing a directory's owner needs root")
    spool = _dir(tmp_path / "spool", 0o755)
    os.chown(spool, 65534, 65534)
    with pytest.raises(UntrustedPathError, match=f"belongs to uid 65534.*fix: chown root {spool}"):
        check_private_dir(spool, "--spool-dir", frozenset({0}))


def test_the_agent_refuses_to_start_on_a_loose_spool(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = _dir(tmp_path / "spool", 0o777)
    with caplog.at_level(logging.ERROR):
        rc = cli.main(["--spool-dir", str(spool), "--state-dir", str(tmp_path / "state"),
                       "--web.listen-address", "127.0.0.1:0"])
    assert rc == 2
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert line.startswith("refusing to start: --spool-dir") and "chmod go-w" in line


def test_a_world_readable_web_config_with_hashes_is_warned(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    web = tmp_path / "web.yml"
    web.write_text("")
    config = WebConfig(users={"prom": b"$2b$04$x"})
    web.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        assert warn_if_web_config_exposed(web, config) is True
    assert f"chmod o-r {web}" in caplog.text
    web.chmod(0o640)
    assert warn_if_web_config_exposed(web, config) is False
    web.chmod(0o644)
    assert warn_if_web_config_exposed(web, WebConfig()) is False  # nothing secret in it
