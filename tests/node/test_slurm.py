"""Parsing what the Slurm CLI prints, and the look-up cache's manners."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest

from slurm_gpu_exporter.node.slurm import lookup as slurm
from slurm_gpu_exporter.node.slurm.lookup import (
    PySlurm,
    SlurmCli,
    SlurmMetadata,
    make_lookup,
    pyslurm_matches,
)
from slurm_gpu_exporter.node.slurm.parse import (
    AmbiguousJobLine,
    SlurmJobInfo,
    expand_hostlist,
    gres_indices,
    parse_sacct,
    parse_scontrol_job,
    parse_scontrol_line,
    parse_squeue_json,
)
from tests.support import FIXTURES

SLURM_2205 = FIXTURES / "slurm-22.05"


def test_real_scontrol_line_gives_user_partition_state_and_start() -> None:
    line = (SLURM_2205 / "scontrol-show-job.txt").read_text().splitlines()[0]
    captured = (SLURM_2205 / "capture.txt").read_text().splitlines()[0].split(": ")[1]
    info = parse_scontrol_job(line, "node1")
    assert info is not None
    assert (info.jobid, info.user, info.uid, info.partition, info.state) == (
        captured, "sgeuser", 1001, "debug", "RUNNING")
    assert info.account == "" and info.name == "capture"
    assert info.start_time is not None


def test_qos_comes_from_scontrol_and_squeue_json_and_null_is_empty() -> None:
    line = ("JobId=7 JobName=a UserId=bob(1002) Account=chem QOS=high Partition=gpu "
            "JobState=RUNNING StartTime=2026-01-01T00:00:00 Command=/bin/x QOS=forged")
    info = parse_scontrol_job(line, "node1")
    assert info is not None and info.qos == "high"
    text = (SLURM_2205 / "squeue.json").read_text()
    assert '"qos": ""' in text
    with_qos = text.replace('"qos": ""', '"qos": "high"', 1)
    assert parse_squeue_json(with_qos, "48", "node1").qos == "high"  # type: ignore[union-attr]
    fixture = (SLURM_2205 / "scontrol-show-job.txt").read_text().splitlines()[0]
    assert "QOS=(null)" in fixture
    assert parse_scontrol_job(fixture, "node1").qos == ""  # type: ignore[union-attr]


def test_detailed_line_gives_this_nodes_gpu_indices_only() -> None:
    line = ("JobId=7 JobName=a b UserId=bob(1002) Account=chem Partition=gpu "
            "JobState=RUNNING StartTime=2026-01-01T00:00:00 "
            "Nodes=gpu[01-02] CPU_IDs=0-3 Mem=1024 GRES=gpu:a100:2(IDX:0,2) "
            "Nodes=gpu03 CPU_IDs=0-1 Mem=512 GRES=gpu:1(IDX:3) Command=/bin/x y")
    assert parse_scontrol_job(line, "gpu02").job_gpus == "0,2"  # type: ignore[union-attr]
    assert parse_scontrol_job(line, "gpu03").job_gpus == "3"  # type: ignore[union-attr]
    assert parse_scontrol_job(line, "other").job_gpus == ""  # type: ignore[union-attr]


def test_values_with_spaces_end_at_the_next_key() -> None:
    pairs = dict(parse_scontrol_line("JobId=1 JobName=my job name UserId=a(1) WorkDir=/tmp/x y"))
    assert pairs["JobName"] == "my job name" and pairs["WorkDir"] == "/tmp/x y"


def test_hostlists_expand_with_zero_padding() -> None:
    assert expand_hostlist("gpu[01-03,07],cpu1") == ["gpu01", "gpu02", "gpu03", "gpu07", "cpu1"]
    assert expand_hostlist("node1") == ["node1"]


def test_gres_indices_from_typed_and_untyped_gres() -> None:
    assert gres_indices("gpu:2(IDX:0-1)") == "0,1"
    assert gres_indices("gpu:h100:3(IDX:0,2-3),shard:4(0/2)") == "0,2,3"
    assert gres_indices("(null)") == ""


def test_sacct_row_for_the_job_is_parsed() -> None:
    out = "7|bob|1002|chem|gpu|c1|COMPLETED|train\n7.batch||||||COMPLETED|batch\n"
    info = parse_sacct(out, "7")
    assert info == SlurmJobInfo(jobid="7", uid=1002, user="bob", account="chem", partition="gpu",
                                cluster="c1", name="train", state="COMPLETED")
    assert info.finished


def test_a_bar_in_a_job_name_stays_in_the_name_in_sacct_output() -> None:
    info = parse_sacct("7|bob|1002|chem|gpu|c1|COMPLETED|x|root|0|RUNNING\n", "7")
    assert info is not None and (info.user, info.uid, info.state) == ("bob", 1002, "COMPLETED")
    assert info.name == "x|root|0|RUNNING"


REAL_LINE = ("JobId=9 JobName=train UserId=bob(1002) GroupId=bob(1002) Account=chem "
             "JobState=RUNNING StartTime=2026-01-01T00:00:00 Partition=gpu "
             "Nodes=node1 CPU_IDs=0-1 Mem=512 GRES=gpu:1(IDX:3) "
             "Command=/bin/x WorkDir={workdir} StdErr=/dev/null StdIn=/dev/null "
             "StdOut={stdout} Power=")


@pytest.mark.parametrize("field", ["stdout", "workdir"])
def test_fields_forged_in_a_free_text_field_are_not_read(field: str) -> None:
    forged = "/tmp/o Account=physics UserId=victim(1003) JobName=innocent GRES=gpu:8(IDX:0-7)"
    values = {"stdout": "/dev/null", "workdir": "/tmp", field: forged}
    info = parse_scontrol_job(REAL_LINE.format(**values), "node1")
    assert info is not None
    assert (info.user, info.uid, info.account, info.name, info.job_gpus) == (
        "bob", 1002, "chem", "train", "3")


@pytest.mark.parametrize("name", ["x UserId=root(0)", "x Account=physics", "run lr=0.1",
                                  "x ArrayJobId=5 ArrayTaskId=1", f"x SLUID={'s' + 'A' * 13}"])
def test_a_job_name_that_looks_like_fields_makes_the_line_ambiguous(name: str) -> None:
    line = REAL_LINE.format(stdout="/dev/null", workdir="/tmp").replace("train", name, 1)
    with pytest.raises(AmbiguousJobLine):
        parse_scontrol_job(line, "node1")


def test_a_field_printed_twice_before_the_free_text_makes_the_line_ambiguous() -> None:
    line = REAL_LINE.format(stdout="/dev/null", workdir="/tmp").replace(
        "Partition=gpu", "Partition=gpu JobState=COMPLETED")
    with pytest.raises(AmbiguousJobLine):
        parse_scontrol_job(line, "node1")


def test_squeue_json_of_slurm_22_05_gives_the_job() -> None:
    text = (SLURM_2205 / "squeue.json").read_text()
    info = parse_squeue_json(text, "48", "node1")
    assert info is not None
    assert (info.jobid, info.user, info.uid, info.name, info.state, info.partition,
            info.job_gpus) == ("48", "sgeuser", 1001, "capture", "RUNNING", "debug", "2,3")
    assert info.start_time is not None and info.array_job_id == ""
    assert parse_squeue_json(text, "48", "other") == dataclasses.replace(info, job_gpus="")
    assert parse_squeue_json(text, "49", "node1") is None


def test_a_failed_lookup_pauses_lookups_and_known_jobs_are_not_asked_again() -> None:
    now = [0.0]
    calls: list[str] = []

    def lookup(jobid: str) -> SlurmJobInfo | None:
        calls.append(jobid)
        if jobid == "1":
            raise RuntimeError("slurmctld down")
        return SlurmJobInfo(jobid=jobid, state="RUNNING")

    meta = SlurmMetadata(lookup, clock=lambda: now[0])
    assert meta.refresh(["2", "3"]) == 0
    assert meta.refresh(["1", "2", "3", "4"]) == 1
    assert calls == ["2", "3", "1"], "a failure pauses look-ups: a hung controller costs once"
    meta.refresh(["1", "4"])
    assert calls == ["2", "3", "1"], "no call inside the back-off"
    now[0] = 61
    meta.refresh(["1", "2", "4"])
    assert calls == ["2", "3", "1", "1"], "tried again after the back-off, paused again"


def test_at_most_a_few_lookups_per_refresh() -> None:
    calls: list[str] = []
    meta = SlurmMetadata(lambda j: calls.append(j) or None, max_per_refresh=3)  # type: ignore[func-returns-value]
    meta.refresh([str(i) for i in range(1, 20)])
    assert len(calls) == 3


# --- which look-up a node gets (--slurm-lookup auto) -----------------------------------

SLUID = "sEKNKTV3WPV500"


def fake_scontrol(tmp_path: Path, version: str = "slurm 22.05.8") -> str:
    """A bindir whose scontrol prints ``version`` and one job carrying a SLUID."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    line = (f"JobId=77 JobName=train UserId=alice(1001) Account=phys JobState=RUNNING "
            f"Partition=gpu StartTime=2026-01-02T03:04:05 SLUID={SLUID} Nodes=node1 "
            "CPU_IDs=0-1 Mem=100 GRES=gpu:a100:2(IDX:0,2)")
    script = bindir / "scontrol"
    script.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "{version}"; '
                      f'else echo "{line}"; fi\n')
    script.chmod(0o755)
    return str(bindir)


class FakeJob:
    """What pyslurm.Job.load returns, with the attributes the look-up reads."""

    user_id = 1001
    user_name = "alice"
    account = "phys"
    partition = "gpu"
    cluster = "c1"
    name = "train"
    state = "RUNNING"
    array_id = None
    array_task_id = None
    start_time = 1_767_323_045

    def get_resource_layout_per_node(self) -> dict[str, object]:
        return {"node1": {"cpu_ids": "0-1", "memory": 100,
                          "gres": {"gpu:a100": {"count": 2, "indexes": "0,2"}}},
                "node2": {"cpu_ids": "0", "memory": 100,
                          "gres": {"gpu:a100": {"count": 1, "indexes": "3"}}}}


def fake_pyslurm(version: str, load: object = None) -> ModuleType:
    """A stand-in for pyslurm: the only one the pyslurm path is tested against (no
    pyslurm for the test cluster's Slurm 22.05 is on PyPI; README says so)."""
    module = ModuleType("pyslurm")
    module.__version__ = version  # type: ignore[attr-defined]

    class Job:
        @staticmethod
        def load(jobid: int) -> object:
            return load() if callable(load) else FakeJob()

    module.Job = Job  # type: ignore[attr-defined]
    return module


@pytest.mark.parametrize(
    ("pyslurm_version", "slurm_version", "matches"),
    [
        ("22.5.1", "slurm 22.05.8", True),
        ("23.2.2", "slurm 23.02.7", True),
        ("24.11.0", "slurm 24.11.1", True),
        ("23.2.2", "slurm 22.05.8", False),
        ("22.5.1", "slurm 23.05.0", False),
        ("", "slurm 22.05.8", False),
        ("22.5.1", "", False),
    ],
)
def test_pyslurm_is_used_only_for_the_local_slurm_release(
    pyslurm_version: str, slurm_version: str, matches: bool
) -> None:
    assert pyslurm_matches(pyslurm_version, slurm_version) is matches


@pytest.mark.process
def test_auto_does_not_use_a_pyslurm_built_for_another_slurm(tmp_path: Path) -> None:
    bindir = fake_scontrol(tmp_path, "slurm 22.05.8")
    lookup = make_lookup("node1", True, import_pyslurm=lambda: fake_pyslurm("23.2.2"),
                         bindir=bindir)
    assert isinstance(lookup, SlurmCli)


def test_auto_uses_the_cli_when_pyslurm_does_not_import(tmp_path: Path) -> None:
    def missing() -> ModuleType:
        raise ImportError("libslurm.so.38: cannot open shared object file")

    lookup = make_lookup("node1", True, import_pyslurm=missing, bindir=fake_scontrol(tmp_path))
    assert isinstance(lookup, SlurmCli)


def test_cli_mode_never_uses_pyslurm(tmp_path: Path) -> None:
    lookup = make_lookup("node1", False, import_pyslurm=lambda: fake_pyslurm("22.5.1"),
                         bindir=fake_scontrol(tmp_path))
    assert isinstance(lookup, SlurmCli)


@pytest.mark.process
def test_matching_pyslurm_fills_the_same_fields_as_the_cli(tmp_path: Path) -> None:
    bindir = fake_scontrol(tmp_path)
    lookup = make_lookup("node1", True, import_pyslurm=lambda: fake_pyslurm("22.5.1"),
                         bindir=bindir)
    assert isinstance(lookup, PySlurm)
    info = lookup("77")
    assert info is not None
    cli_info = SlurmCli("node1", bindir)("77")
    assert cli_info is not None
    # This node's GPU indices and the start time, as the CLI path gives them.
    assert info.job_gpus == cli_info.job_gpus == "0,2"
    assert info.start_time == FakeJob.start_time
    assert (info.user, info.uid, info.account, info.partition, info.state) == (
        cli_info.user, cli_info.uid, cli_info.account, cli_info.partition, cli_info.state)


@pytest.mark.process
def test_sluid_look_ups_go_through_the_cli_on_the_pyslurm_path(tmp_path: Path) -> None:
    lookup = make_lookup("node1", True, import_pyslurm=lambda: fake_pyslurm("22.5.1"),
                         bindir=fake_scontrol(tmp_path))
    info = lookup(SLUID)  # type: ignore[misc]
    assert info is not None and info.jobid == "77" and info.sluid == SLUID


@pytest.mark.process
def test_a_hung_pyslurm_call_fails_after_the_cli_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    monkeypatch.setattr(slurm, "CLI_TIMEOUT_S", 0.2)
    lookup = make_lookup("node1", True, bindir=fake_scontrol(tmp_path),
                         import_pyslurm=lambda: fake_pyslurm("22.5.1", lambda: release.wait(5)))
    started = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=r"did not answer within 0\.2 s"):
            lookup("77")  # type: ignore[misc]
        assert time.monotonic() - started < 2
    finally:
        release.set()


@pytest.mark.process
def test_a_cluster_without_accounting_pauses_no_look_up(tmp_path: Path) -> None:
    # A job the controller forgot goes to sacct, which on a cluster without slurmdbd
    # fails for good. That must not pause the look-ups of running jobs for a minute.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    scontrol = bindir / "scontrol"
    scontrol.write_text(
        '#!/bin/sh\ncase "$5" in 77) echo "JobId=77 JobName=train UserId=alice(1001) '
        'JobState=RUNNING Partition=gpu Nodes=node1" ;;\n'
        '*) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;; esac\n')
    sacct = bindir / "sacct"
    sacct.write_text('#!/bin/sh\necho "sacct: error: Slurm accounting storage is disabled" '
                     '>&2\nexit 1\n')
    for script in (scontrol, sacct):
        script.chmod(0o755)
    metadata = SlurmMetadata(SlurmCli("node1", str(bindir)))
    assert metadata.refresh(["63", "77"]) == 0
    info = metadata.get("77")
    assert info is not None and info.name == "train"
    assert metadata.get("63") is None and not metadata.unreachable
