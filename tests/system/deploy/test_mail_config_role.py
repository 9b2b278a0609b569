"""The node role's slurm-gpu-mail config, applied for real with ansible-playbook
(site.yml's controller play, ``connection: local``): the settings become the file the
wrapper reads, checked by ``slurm-gpu-mail --check``; a misspelt key, or a mailer that is
not there, stops the role, and a file that fails the check never replaces the one in
place. The file's path points into a temporary directory, so nothing of /etc is
written; the check is the dev venv's slurm-gpu-mail."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from slurm_gpu_exporter.mail.config import load_mail_config
from tests.system.deploy.local_play import VENV_BIN, changed, play

pytestmark = pytest.mark.process



def _play(base: Path, settings: dict[str, object]) -> subprocess.CompletedProcess[str]:
    return play(base, "slurm_controllers", {
        "slurm_gpu_exporter_mail_config": str(base / "etc" / "mail.toml"),
        "slurm_gpu_exporter_mail_program": str(VENV_BIN / "slurm-gpu-mail"),
        "slurm_gpu_exporter_mail_settings": settings})


def _mailer(base: Path) -> str:
    path = base / "site-mailer"
    path.write_text("#!/bin/sh\ncat > /dev/null\n")
    path.chmod(0o755)
    return str(path)


def test_the_written_mail_config_is_what_the_wrapper_reads_and_a_typo_stops_the_role(
        tmp_path: Path) -> None:
    mailer = _mailer(tmp_path)
    settings = {"mailer": mailer, "summary_timeout_seconds": 5,
                "report_args": ["--no-sacct", 'a "quoted" arg'],
                "log_file": str(tmp_path / "mail.log")}
    assert changed(_play(tmp_path, settings)) == 2  # the directory and the file
    path = tmp_path / "etc" / "mail.toml"
    info = path.stat()
    assert (info.st_mode & 0o7777, info.st_uid, info.st_gid) == (0o644, 0, 0)
    loaded = load_mail_config(path)
    assert loaded.problems == ()
    assert (loaded.config.mailer, loaded.config.summary_timeout_s,
            loaded.config.report_args) == (mailer, 5.0, ("--no-sacct", 'a "quoted" arg'))
    assert changed(_play(tmp_path, settings)) == 0  # the check changes nothing
    good = path.read_text()

    typo = _play(tmp_path, {**settings, "mailer_timeout_secs": 30})
    assert typo.returncode != 0, typo.stdout[-2000:]
    assert ("mailer_timeout_secs: unknown key, ignored (did you mean "
            "'mailer_timeout_seconds'?)") in typo.stdout, typo.stdout[-3000:]
    assert path.read_text() == good  # the config in place is left as it was


def test_a_mailer_gone_from_the_host_fails_the_check_of_an_unchanged_file(
        tmp_path: Path) -> None:
    mailer = _mailer(tmp_path)
    assert changed(_play(tmp_path, {"mailer": mailer})) == 2
    os.unlink(mailer)
    run = _play(tmp_path, {"mailer": mailer})
    assert run.returncode != 0, run.stdout[-2000:]
    assert f"mailer: {mailer} does not exist" in run.stdout, run.stdout[-3000:]
    assert "Check the mail config in place" in run.stdout.rsplit("fatal:", 1)[0][-600:]


def test_no_mail_settings_write_no_mail_config(tmp_path: Path) -> None:
    assert changed(_play(tmp_path, {})) == 0
    assert not (tmp_path / "etc").exists()
