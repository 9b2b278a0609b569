"""The shared pieces: kernel file reader, Slurm id grammar, uid-to-name lookup."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from slurm_gpu_exporter.hooks import ids, spool
from slurm_gpu_exporter.model import ids as grammar
from slurm_gpu_exporter.node import kernelfile
from slurm_gpu_exporter.node.cgroup.paths import parse_cgroup_path
from slurm_gpu_exporter.node.procfs import PidJobMapper

# A uid no user database gives out (Slurm's NO_VAL - 1 as a uid).
UNKNOWN_UID = 4294967293


def test_read_kernel_file_reads_all_of_a_file_that_reports_size_zero() -> None:
    # /proc files report st_size 0; the reader must not trust it.
    assert os.stat("/proc/self/status").st_size == 0
    assert kernelfile.read_kernel_file("/proc/self/status").startswith(b"Name:")


def test_read_kernel_file_raises_oserror_for_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        kernelfile.read_kernel_file(tmp_path / "absent")


@pytest.mark.parametrize("text", ["1", "42", "4294967293"])
def test_job_id_pattern_accepts_plain_ids(text: str) -> None:
    assert grammar.is_slurm_id(text)


@pytest.mark.parametrize("text", ["0", "012", "-1", "+1", "1a", "", "12345678901"])
def test_job_id_pattern_refuses_what_slurm_never_prints(text: str) -> None:
    assert not grammar.is_slurm_id(text)


@pytest.mark.parametrize("jobid", ["0", "012", "1a"])
def test_spool_cgroup_paths_and_environ_agree_on_job_ids(jobid: str, tmp_path: Path) -> None:
    """The one pattern serves every reader: none accepts an id another refuses."""
    assert not grammar.is_job_id(jobid)
    assert spool.job_id_of_record_name(f"{jobid}.json") is None
    assert parse_cgroup_path(f"/slurm/uid_0/job_{jobid}/step_0") is None
    proc = tmp_path / "7"
    proc.mkdir()
    (proc / "cgroup").write_text("0::/user.slice\n")
    (proc / "environ").write_bytes(f"SLURM_JOB_ID={jobid}\0".encode())
    assert PidJobMapper(tmp_path, environ_fallback=True).job_of(7) is None


def test_step_id_pattern_accepts_zero() -> None:
    assert grammar.is_slurm_num("0")
    assert not grammar.is_slurm_num("00")


def test_user_name_of_a_known_uid() -> None:
    assert ids.user_name(os.getuid()) == pwd.getpwuid(os.getuid()).pw_name


def test_user_name_of_an_unknown_uid_is_none_and_not_remembered() -> None:
    assert ids.user_name(UNKNOWN_UID) is None
    assert UNKNOWN_UID not in ids._user_names  # a directory service may learn it later


def test_user_name_is_looked_up_once_per_uid() -> None:
    ids._user_names.pop(0, None)
    assert ids.user_name(0) == "root"
    assert ids._user_names[0] == "root"
