"""Parsing what the Slurm CLI prints, and the look-up cache's manners."""

from __future__ import annotations

from pathlib import Path

from slurm_gpu_exporter.slurm import (
    SlurmJobInfo,
    SlurmMetadata,
    expand_hostlist,
    gres_indices,
    parse_sacct,
    parse_scontrol_job,
    parse_scontrol_line,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm-22.05"


def test_real_scontrol_line_gives_user_partition_state_and_start() -> None:
    line = (FIXTURES / "scontrol-show-job.txt").read_text().splitlines()[0]
    captured = (FIXTURES / "capture.txt").read_text().splitlines()[0].split(": ")[1]
    info = parse_scontrol_job(line, "node1")
    assert info is not None
    assert (info.jobid, info.user, info.uid, info.partition, info.state) == (
        captured, "sgeuser", 1001, "debug", "RUNNING")
    assert info.account == "" and info.name == "capture"
    assert info.start_time is not None


def test_detailed_line_gives_this_nodes_gpu_indices_only() -> None:
    line = ("JobId=7 JobName=a b=c UserId=bob(1002) Account=chem Partition=gpu "
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
    out = "7|bob|1002|chem|gpu|c1|train|COMPLETED\n7.batch||||||batch|COMPLETED\n"
    info = parse_sacct(out, "7")
    assert info == SlurmJobInfo(jobid="7", uid=1002, user="bob", account="chem", partition="gpu",
                                cluster="c1", name="train", state="COMPLETED")
    assert info.finished


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
