"""The spool reader refuses anything it cannot trust, with a reason, and keeps going."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_gpu_exporter.hooks import spool
from slurm_gpu_exporter.model.ids import is_job_id

TRUSTED = frozenset({0, os.geteuid()})


def _write(dir_path: Path, record: spool.JobRecord) -> None:
    fd = spool.open_spool_dir(str(dir_path), create=True)
    try:
        spool.write_record(fd, record)
    finally:
        os.close(fd)


def _read(dir_path: Path, name: str, trusted: frozenset[int] = TRUSTED) -> spool.JobRecord:
    fd = spool.open_spool_dir(str(dir_path))
    try:
        return spool.read_record(fd, name, trusted)
    finally:
        os.close(fd)


def test_written_record_reads_back_identical(tmp_path: Path) -> None:
    record = spool.JobRecord(jobid="42", uid=1001, user="alice", job_gpus="0,1",
                             cuda_visible_devices="GPU-aa,GPU-bb", start_time=1.5)
    _write(tmp_path, record)
    assert _read(tmp_path, "42.json") == record
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temp file left"


def test_ended_keeps_the_first_end_time() -> None:
    record = spool.JobRecord(jobid="1", uid=0).ended(10.0)
    assert record.ended(20.0).end_time == 10.0


@pytest.mark.parametrize("value", ["1", "4294967293", "123456"])
def test_plain_job_ids_are_accepted(value: str) -> None:
    assert is_job_id(value)


@pytest.mark.parametrize("value", ["", "0", "007", "-1", "1.0", "../1", "1/2", '"1"', "1 ",
                                   "4294967294", "99999999999", "1_2", "1e3", "١٢"])
def test_job_ids_that_are_not_slurm_job_ids_are_refused(value: str) -> None:
    assert not is_job_id(value)


@pytest.mark.parametrize("name", ["../1.json", "1.json.tmp", ".1.json", "x.json", "01.json",
                                  "1.JSON", "'1'.json"])
def test_record_names_that_are_not_job_ids_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(spool.SpoolError, match="file name"):
        _read(tmp_path, name)


def test_oversized_record_is_refused(tmp_path: Path) -> None:
    (tmp_path / "5.json").write_bytes(b" " * (spool.MAX_RECORD_BYTES + 1))
    with pytest.raises(spool.SpoolError, match="larger than"):
        _read(tmp_path, "5.json")


def test_record_that_is_not_json_is_refused(tmp_path: Path) -> None:
    (tmp_path / "5.json").write_bytes(b"\xff\xfe{not json")
    with pytest.raises(spool.SpoolError, match="not JSON"):
        _read(tmp_path, "5.json")


def test_symlinked_record_is_refused_even_to_a_valid_record(tmp_path: Path) -> None:
    _write(tmp_path, spool.JobRecord(jobid="6", uid=0))
    (tmp_path / "7.json").symlink_to(tmp_path / "6.json")
    with pytest.raises(spool.SpoolError, match="symbolic link"):
        _read(tmp_path, "7.json")


def test_fifo_in_the_spool_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "8.json")
    with pytest.raises(spool.SpoolError, match="not a regular file"):
        _read(tmp_path, "8.json")


def test_record_owned_by_an_untrusted_user_is_refused(tmp_path: Path) -> None:
    # The record is the current user's; trusting only other uids makes it a stranger's,
    # as root and as anyone else, without chown.
    _write(tmp_path, spool.JobRecord(jobid="9", uid=0))
    me = os.geteuid()
    others = frozenset({me + 1, 65534 if me != 65534 else 65533})
    with pytest.raises(spool.SpoolError, match=f"owned by uid {me}"):
        _read(tmp_path, "9.json", others)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ([], "not a JSON object"),
        ({"version": 2, "jobid": "10", "uid": 0}, "schema version"),
        ({"version": 1, "jobid": "11", "uid": 0}, "does not match its file name"),
        ({"version": 1, "jobid": "../10", "uid": 0}, "invalid jobid"),
        ({"version": 1, "jobid": 10, "uid": 0}, "invalid jobid"),
        ({"version": 1, "jobid": "10", "uid": -1}, "invalid uid"),
        ({"version": 1, "jobid": "10", "uid": True}, "invalid uid"),
        ({"version": 1, "jobid": "10", "uid": 0, "user": ["x"]}, "'user'"),
        ({"version": 1, "jobid": "10", "uid": 0, "account": "a" * 5000}, "'account'"),
        ({"version": 1, "jobid": "10", "uid": 0, "start_time": "yesterday"}, "'start_time'"),
    ],
)
def test_record_with_a_bad_schema_is_refused(tmp_path: Path, data: object, reason: str) -> None:
    (tmp_path / "10.json").write_text(json.dumps(data))
    with pytest.raises(spool.SpoolError, match=reason):
        _read(tmp_path, "10.json")


def test_spool_dir_reached_through_a_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(OSError):
        spool.open_spool_dir(str(tmp_path / "link"), create=True)


def test_write_replaces_a_symlink_instead_of_following_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    (spool_dir / "12.json").symlink_to(victim)
    _write(spool_dir, spool.JobRecord(jobid="12", uid=0))
    assert victim.read_text() == "keep me"
    assert not (spool_dir / "12.json").is_symlink()


def test_a_record_is_an_immutable_value() -> None:
    record = spool.JobRecord("7", 1001, user="alice", start_time=2.0)
    same = spool.JobRecord(jobid="7", uid=1001, user="alice", start_time=2.0)
    assert record == same and hash(record) == hash(same) and len({record, same}) == 1
    assert record != spool.JobRecord(jobid="7", uid=1001, user="bob", start_time=2.0)
    assert record != ("7", 1001)
    assert repr(record).startswith("JobRecord(jobid='7', uid=1001, user='alice', account=''")
    assert repr(record).endswith("start_time=2.0, end_time=None)")
    with pytest.raises(AttributeError):
        record.user = "mallory"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del record.user  # type: ignore[misc]
    ended = record.ended(5.0)
    assert ended.end_time == 5.0 and ended.user == "alice" and record.end_time is None
    assert ended == spool.JobRecord(jobid="7", uid=1001, user="alice", start_time=2.0,
                                    end_time=5.0)


@pytest.mark.parametrize("name", ["1.json", "4294967293.json", "0.json", "01.json",
                                  "4294967294.json", "1.json.tmp", ".1.json", "1.JSON",
                                  "1json", ".json", "\u0661.json", "training.sock"])
def test_record_names_are_job_ids_with_the_suffix(name: str) -> None:
    import re

    match = re.fullmatch(r"([1-9][0-9]{0,9})\.json", name)
    expected = match.group(1) if match and int(match.group(1)) <= 0xFFFFFFFD else None
    assert spool.job_id_of_record_name(name) == expected
