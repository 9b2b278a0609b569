"""The prolog and epilog always exit 0, say what went wrong on stderr, and never block."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu_exporter.hooks import jobhooks, spool
from tests.support import REPO, require

BIN = Path(sys.executable).parent
# What slurmd 22.05 gave a real prolog (tests/fixtures/slurm-22.05/prolog-env.txt).
PROLOG_ENV = dict(
    line.split("=", 1)
    for line in (REPO / "tests/fixtures/slurm-22.05/prolog-env.txt").read_text().splitlines()
    if "=" in line
)


def run_hook(kind: str, env: dict[str, str] | dict[bytes, bytes], spool_dir: Path | str
             ) -> subprocess.CompletedProcess[str]:
    """Run the installed entry point as slurmd would: bare environment, absolute path."""
    return subprocess.run(
        [str(BIN / f"slurm-gpu-exporter-{kind}"), "--spool-dir", str(spool_dir)],
        env=env, capture_output=True, text=True, timeout=10, check=False,
    )


@pytest.mark.process
def test_prolog_records_what_slurmd_gave_it(tmp_path: Path) -> None:
    result = run_hook("prolog", PROLOG_ENV, tmp_path / "spool")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    data = json.loads((tmp_path / "spool" / f"{PROLOG_ENV['SLURM_JOB_ID']}.json").read_text())
    assert data["uid"] == int(PROLOG_ENV["SLURM_JOB_UID"])
    assert data["user"] == PROLOG_ENV["SLURM_JOB_USER"]
    assert data["job_gpus"] == PROLOG_ENV["SLURM_JOB_GPUS"]
    assert data["cuda_visible_devices"] == PROLOG_ENV["CUDA_VISIBLE_DEVICES"]
    assert data["partition"] == PROLOG_ENV["SLURM_JOB_PARTITION"]
    assert data["node"] == PROLOG_ENV["SLURMD_NODENAME"]
    assert data["end_time"] is None and data["start_time"] > 0


@pytest.mark.process
def test_prolog_records_the_jobs_qos_where_slurmd_gives_it(tmp_path: Path) -> None:
    with_qos = PROLOG_ENV | {"SLURM_JOB_QOS": "high"}
    assert run_hook("prolog", with_qos, tmp_path / "a").returncode == 0
    assert run_hook("prolog", PROLOG_ENV, tmp_path / "b").returncode == 0  # 22.05 sets none
    record = f"{PROLOG_ENV['SLURM_JOB_ID']}.json"
    assert json.loads((tmp_path / "a" / record).read_text())["qos"] == "high"
    assert json.loads((tmp_path / "b" / record).read_text())["qos"] == ""


@pytest.mark.process
def test_epilog_marks_the_record_ended_and_keeps_the_rest(tmp_path: Path) -> None:
    run_hook("prolog", PROLOG_ENV, tmp_path)
    result = run_hook("epilog", PROLOG_ENV, tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / f"{PROLOG_ENV['SLURM_JOB_ID']}.json").read_text())
    assert data["end_time"] >= data["start_time"]
    assert data["job_gpus"] == PROLOG_ENV["SLURM_JOB_GPUS"]


@pytest.mark.process
def test_epilog_without_a_prolog_record_writes_an_ended_record(tmp_path: Path) -> None:
    result = run_hook("epilog", PROLOG_ENV, tmp_path)
    assert result.returncode == 0
    data = json.loads((tmp_path / f"{PROLOG_ENV['SLURM_JOB_ID']}.json").read_text())
    assert data["start_time"] is None and data["end_time"] > 0


@pytest.mark.parametrize("kind", ["prolog", "epilog"])
@pytest.mark.parametrize(
    "env",
    [
        {},
        {"SLURM_JOB_ID": "../../etc/passwd", "SLURM_JOB_UID": "0"},
        {"SLURM_JOB_ID": "12", "SLURM_JOB_UID": "root"},
        {"SLURM_JOB_ID": '"12"', "SLURM_JOB_UID": "0"},
        {"SLURM_JOB_ID": "12; rm -rf /", "SLURM_JOB_UID": "0"},
    ],
)
@pytest.mark.process
def test_a_bad_job_id_or_uid_is_refused_with_exit_0(tmp_path: Path, kind: str,
                                                     env: dict[str, str]) -> None:
    result = run_hook(kind, env, tmp_path)
    assert result.returncode == 0
    assert f"slurm-gpu-exporter-{kind}:" in result.stderr
    assert "refusing job id" in result.stderr or "is not a uid" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.process
@pytest.mark.parametrize("kind", ["prolog", "epilog"])
def test_garbage_environment_values_are_cleaned_not_fatal(tmp_path: Path, kind: str) -> None:
    env = {
        b"SLURM_JOB_ID": b"77",
        b"SLURM_JOB_UID": b"1001",
        b"SLURM_JOB_USER": b"al\xffice\x1b[31m",
        b"SLURM_JOB_PARTITION": b"p" * 100_000,
        b"CUDA_VISIBLE_DEVICES": b"\x00"[:0] + b"GPU-\xfe",
    }
    result = run_hook(kind, env, tmp_path)
    assert result.returncode == 0, result.stderr
    record = spool.parse_record((tmp_path / "77.json").read_bytes(), "77")
    assert record.user == "al\ufffdice\ufffd[31m"
    assert len(record.partition) == spool.MAX_FIELD_CHARS


@pytest.mark.process
@pytest.mark.parametrize("kind", ["prolog", "epilog"])
def test_unusable_spool_path_exits_0_with_a_message(tmp_path: Path, kind: str) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    for spool_dir in (blocker, blocker / "sub", "/proc/sys/no-such-dir"):
        result = run_hook(kind, PROLOG_ENV, spool_dir)
        assert result.returncode == 0
        assert f"slurm-gpu-exporter-{kind}: job {PROLOG_ENV['SLURM_JOB_ID']}:" in result.stderr


@pytest.mark.process
@pytest.mark.parametrize("kind", ["prolog", "epilog"])
def test_spool_dir_that_is_a_symlink_is_not_followed(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "spool").symlink_to(target)
    result = run_hook(kind, PROLOG_ENV, tmp_path / "spool")
    assert result.returncode == 0
    assert "Too many levels of symbolic links" in result.stderr or "Not a directory" in (
        result.stderr)
    assert list(target.iterdir()) == []


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A tiny tmpfs of our own, to make the spool read-only or full for real."""
    require(os.geteuid() == 0 and shutil.which("mount") is not None,
            "mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k,mode=755", "tmpfs", str(mnt)],
                   check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.process
@pytest.mark.parametrize("kind", ["prolog", "epilog"])
def test_read_only_spool_exits_0_with_a_message(tmpfs: Path, kind: str) -> None:
    (tmpfs / "spool").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    result = run_hook(kind, PROLOG_ENV, tmpfs / "spool")
    assert result.returncode == 0
    assert "Read-only file system" in result.stderr


@pytest.mark.process
@pytest.mark.parametrize("kind", ["prolog", "epilog"])
def test_full_disk_exits_0_and_leaves_no_partial_record(tmpfs: Path, kind: str) -> None:
    spool_dir = tmpfs / "spool"
    spool_dir.mkdir()
    fd = os.open(tmpfs / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"x" * 4096):
            pass
    except OSError:
        pass  # ENOSPC: the disk is full, as wanted
    finally:
        os.close(fd)
    result = run_hook(kind, PROLOG_ENV, spool_dir)
    assert result.returncode == 0
    assert "No space left on device" in result.stderr
    assert list(spool_dir.iterdir()) == []


@pytest.mark.process
@pytest.mark.parametrize("script", ["prolog", "epilog"])
def test_shell_wrapper_exits_0_when_the_helper_is_missing_or_failing(script: str) -> None:
    result = subprocess.run(["/bin/sh", str(REPO / script / "slurm-gpu-exporter.sh")],
                            env={"SLURM_JOB_ID": "not-a-job"}, capture_output=True, text=True,
                            timeout=10, check=False)
    assert result.returncode == 0
    assert result.stderr, "the wrapper or the helper must say what went wrong"


def test_prolog_and_epilog_never_wait_on_anything(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """What "fast enough for slurmd" stands for, whatever the machine's load (the wall
    time is bench/hooks.py's): the hooks never sleep, lock, poll, connect or start a
    process, so nothing they do waits on the agent, Slurm or another job's hook."""
    import fcntl
    import select
    import socket

    def waits(*args: object, **kwargs: object) -> None:
        raise AssertionError("a hook waited")

    for module, name in [(time, "sleep"), (socket, "socket"), (socket, "create_connection"),
                         (subprocess, "Popen"), (os, "fork"), (os, "posix_spawn"),
                         (os, "system"), (select, "select"), (select, "poll"),
                         (fcntl, "flock"), (fcntl, "lockf")]:
        monkeypatch.setattr(module, name, waits)
    jobhooks.run_prolog(PROLOG_ENV, str(tmp_path), time.time())
    jobhooks.run_epilog(PROLOG_ENV, str(tmp_path), time.time())
    record = json.loads((tmp_path / f"{PROLOG_ENV['SLURM_JOB_ID']}.json").read_text())
    assert record["end_time"] is not None


@pytest.mark.process
def test_shell_wrapper_falls_back_to_site_where_site_packages_lacks_the_package(
        tmp_path: Path) -> None:
    """The development venv (an editable install: the package is found through a .pth
    file, not in site-packages) as the prefix: the scripts' -I -S start finds nothing
    there, runs site after all, and the job is still recorded and marked ended."""
    prefix = Path(sys.prefix)
    assert (prefix / "bin" / "python").exists()
    defaults = tmp_path / "defaults"
    defaults.write_text(f"SLURM_GPU_EXPORTER_PREFIX={prefix}\n")
    env = {"SLURM_JOB_ID": "88", "SLURM_JOB_UID": "0",
           "SLURM_GPU_EXPORTER_SPOOL_DIR": str(tmp_path / "spool")}
    for kind in ("prolog", "epilog"):
        wrapper = tmp_path / f"{kind}.sh"
        text = (REPO / kind / "slurm-gpu-exporter.sh").read_text()
        wrapper.write_text(text.replace("/etc/default/slurm-gpu-exporter", str(defaults)))
        result = subprocess.run(["/bin/sh", str(wrapper)], env=env, capture_output=True,
                                text=True, timeout=30, check=False)
        assert result.returncode == 0 and result.stderr == "", result.stderr
    data = json.loads((tmp_path / "spool" / "88.json").read_text())
    assert data["uid"] == 0 and data["start_time"] and data["end_time"]


@pytest.mark.process
@pytest.mark.parametrize("script", ["prolog", "epilog"])
def test_shell_wrapper_exits_0_when_the_prefix_python_cannot_import_the_package(
        tmp_path: Path, script: str) -> None:
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python").symlink_to(Path(sys.base_prefix) / "bin" / "python3")
    defaults = tmp_path / "defaults"
    defaults.write_text(f"SLURM_GPU_EXPORTER_PREFIX={prefix}\n")
    wrapper = tmp_path / f"{script}.sh"
    text = (REPO / script / "slurm-gpu-exporter.sh").read_text()
    wrapper.write_text(text.replace("/etc/default/slurm-gpu-exporter", str(defaults)))
    result = subprocess.run(["/bin/sh", str(wrapper)], env={"SLURM_JOB_ID": "1"},
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0
    assert f"{script} helper {prefix}/bin/slurm-gpu-exporter-{script} failed" in result.stderr


def test_spool_dir_comes_from_the_defaults_file(tmp_path: Path) -> None:
    defaults = tmp_path / "defaults"
    defaults.write_text('# comment\nSLURM_GPU_EXPORTER_SPOOL_DIR="/srv/spool"\nOTHER=1\n')
    from_file = jobhooks.read_defaults(str(defaults))
    assert jobhooks.spool_dir_from([], {}, from_file) == "/srv/spool"
    env = {"SLURM_GPU_EXPORTER_SPOOL_DIR": "/env"}
    assert jobhooks.spool_dir_from([], env, from_file) == "/env"
    assert jobhooks.spool_dir_from(["--spool-dir=/x"], env, from_file) == "/x"
    assert jobhooks.spool_dir_from([], {}, {}) == spool.DEFAULT_SPOOL_DIR


@pytest.mark.process
@pytest.mark.parametrize("script", ["prolog", "epilog"])
@pytest.mark.parametrize("quoted", ["{p}", "'{p}'", '"{p}"', "  {p}  ", " ' {p}' ", '"{p}"  '])
def test_defaults_file_is_read_by_the_same_rules_in_shell_and_python(
    tmp_path: Path, script: str, quoted: str
) -> None:
    # A prefix with a space in it; the value unquoted, single- or double-quoted, with
    # spaces around it; a comment line that names the key too. The shell wrapper must
    # exec the helper under the prefix the agent's reader reads.
    prefix = tmp_path / "opt dir"
    if quoted.startswith(" ' "):
        prefix = tmp_path / " opt dir"  # the spaces inside the quotes belong to the value
        quoted = " '{p}' "
    helper = prefix / "bin" / f"slurm-gpu-exporter-{script}"
    helper.parent.mkdir(parents=True)
    marker = tmp_path / "ran"
    helper.write_text(f"#!/bin/sh\necho ok > '{marker}'\n")
    helper.chmod(0o755)
    value = quoted.format(p=prefix)
    defaults = tmp_path / "defaults"
    defaults.write_text(f"# SLURM_GPU_EXPORTER_PREFIX=/commented/out\n\n"
                        f"  SLURM_GPU_EXPORTER_PREFIX ={value}\nOTHER='x'\n")
    assert jobhooks.read_defaults(str(defaults))["SLURM_GPU_EXPORTER_PREFIX"] == str(prefix)
    wrapper = tmp_path / f"{script}.sh"
    text = (REPO / script / "slurm-gpu-exporter.sh").read_text()
    assert "/etc/default/slurm-gpu-exporter" in text
    wrapper.write_text(text.replace("/etc/default/slurm-gpu-exporter", str(defaults)))
    result = subprocess.run(["/bin/sh", str(wrapper)], env={"SLURM_JOB_ID": "1"},
                            capture_output=True, text=True, timeout=10, check=False)
    assert result.returncode == 0
    assert marker.read_text() == "ok\n", result.stderr


def test_defaults_values_lose_one_pair_of_matching_quotes_only(tmp_path: Path) -> None:
    defaults = tmp_path / "defaults"
    defaults.write_text("A='x'\nB=\"y\"\nC='z\"\nD=''\nE='\"w\"'\nF=\"\n")
    assert jobhooks.read_defaults(str(defaults)) == {
        "A": "x", "B": "y", "C": "'z\"", "D": "", "E": '"w"', "F": '"'}
