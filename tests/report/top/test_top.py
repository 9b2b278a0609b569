"""``top``'s pure parts: the answers to its queries as figures, staleness, and the frame.
The command against a real Prometheus is test_top_real.py."""

from __future__ import annotations

import os

import pytest

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.shapes import GpuDetail, JobDetail, JobUsage, NodeDetail
from slurm_gpu_exporter.report.prometheus.client import Sample
from slurm_gpu_exporter.report.prometheus.queries import Filters
from slurm_gpu_exporter.report.top.frame import frame
from slurm_gpu_exporter.report.top.now import GpuNow, JobNow, NodeNow, job_now, now_queries

GIB = 1024**3
A, B = "gpu01:9817", "gpu01:9818"  # two agents on one host: the nodes keep their ports


def _s(value: float, **labels: str) -> Sample:
    return Sample(labels=labels, value=value)


def test_the_answers_become_each_gpu_s_share_now_matched_by_target_and_uuid() -> None:
    now = job_now({
        "uuids": [_s(1, instance=A, gpu="0", uuid="GPU-a"),
                  _s(1, instance=A, gpu="1", uuid="GPU-b"),
                  _s(1, instance=B, gpu="0", uuid="GPU-c")],
        "allocated": [_s(1.0, instance=A, gpu="0"), _s(1.0, instance=A, gpu="1"),
                      _s(0.0, instance=B, gpu="0")],  # B's GPU: nothing measured lately
        "busy": [_s(0.25, instance=A, gpu="0"), _s(0.0, instance=B, gpu="0")],
        "sm_active": [_s(0.125, instance=A, gpu="0")],
        "power": [_s(210.0, instance=A, gpu="0")],
        "gpu_memory": [_s(3 * GIB, instance=A, gpu="1")],
        "temperature": [_s(70, instance=A, uuid="GPU-b"), _s(55, instance=B, uuid="GPU-c"),
                        _s(99, instance=A, uuid="GPU-z")],
        "cpu": [_s(2.5, instance=A)],
        "memory": [_s(4 * GIB, instance=B)],
        "last_sample": [_s(1000.0)],
    })
    assert now.gpus == {
        (A, "0"): GpuNow(busy=0.25, sm_active=0.125, power_w=210.0),
        (A, "1"): GpuNow(busy=0.0, memory_used=3 * GIB, temperature_c=70),  # no busy: 0
        (B, "0"): GpuNow(temperature_c=55),  # held but unmeasured: no share, not 0
    }
    assert now.nodes == {A: NodeNow(cpu_cores=2.5), B: NodeNow(memory_used=4 * GIB)}
    assert now.last_sample == 1000.0


def test_a_job_with_no_sample_in_three_minutes_is_stale() -> None:
    assert JobNow(last_sample=1000.0).stale(1180.0) is False
    assert JobNow(last_sample=1000.0).stale(1181.0) is True
    assert JobNow().stale(1000.0) is True


def test_every_query_is_narrowed_to_the_one_job_and_their_number_is_fixed() -> None:
    queries = now_queries("4242_7", Filters(cluster="west"))
    assert len(queries) == 10
    for name, query in queries.items():
        assert 'jobid="4242_7"' in query and 'cluster="west"' in query, name
    with pytest.raises(ReportError, match="bad job id"):
        now_queries('1"} or up{x="', Filters())


def _detail(name: str = "resnet", user: str = "dana") -> JobDetail:
    gpus = [GpuDetail("0", "GPU-a", allocated_s=3600, busy_s=1260, memory_peak=12 * GIB,
                      sm_active_s=900)]
    return JobDetail(usage=JobUsage("8880001", user=user, name=name, gpus=1, start=1000.0),
                     nodes=[NodeDetail(A, cpus=8, cpu_s=4 * 3600, memory_peak=14 * GIB,
                                       memory_limit=32 * GIB, gpus=gpus),
                            NodeDetail(B, cpus=8, gpus=[GpuDetail("0", "GPU-c")])],
                     accounting=None, now=4600.0, notes=["a note [bold]x[/bold]"])


def test_the_frame_puts_now_beside_the_whole_job_per_node_and_gpu() -> None:
    now = JobNow(gpus={(A, "0"): GpuNow(busy=0.8, sm_active=0.7, memory_used=10 * GIB,
                                        power_w=300.0, temperature_c=71.0)},
                 nodes={A: NodeNow(cpu_cores=4.0, memory_used=12 * GIB)}, last_sample=4590.0)
    text = frame(_detail(), now, 4600.0, 5.0)
    lines = text.splitlines()
    assert lines[0] == "Job 8880001 (resnet)  user dana  run time 1h00m"
    assert lines[1] == "at 1970-01-01 01:16:40 UTC, every 5 s; last sample 10 s ago"
    row_a = next(x for x in lines if x.strip().startswith(A)).split()
    assert row_a == [A, "0", "80%", "35%", "70%", "25%", "10.0", "GiB", "12.0", "GiB", "300",
                     "W", "71", "C"]
    row_b = next(x for x in lines if x.strip().startswith(B)).split()
    assert row_b == [B, "0", *["-"] * 8]  # no figures: dashes
    assert "CPU     4.0 cores busy now of 16 CPUs; 25% over the job" in lines
    assert "Memory  12.0 GiB now of 32.0 GiB; peak 14.0 GiB" in lines
    assert "  * a note [bold]x[/bold]" in lines  # markup shown, not applied


def test_the_frame_names_a_target_by_the_slurm_node_the_job_report_gives_it() -> None:
    """A target named by address: its live figures go on the node's row."""
    detail = JobDetail(usage=JobUsage("7", user="ann", gpus=1, start=1000.0),
                       nodes=[NodeDetail("gpu09", target="10.0.0.9:9817",
                                         gpus=[GpuDetail("0", "GPU-a", allocated_s=60)])],
                       accounting=None, now=1060.0)
    now = JobNow(gpus={("10.0.0.9:9817", "0"): GpuNow(busy=0.8)}, last_sample=1059.0)
    row = next(x for x in frame(detail, now, 1060.0, None).splitlines()
               if x.strip().startswith("gpu09")).split()
    assert row[:3] == ["gpu09", "0", "80%"]


def test_user_text_in_the_frame_is_inert() -> None:
    text = frame(_detail(name="\x1b]0;pwned\x07x[/]", user="eve\x1b[2J"), JobNow(), 10.0, None)
    assert "\x1b" not in text and "\x07" not in text
    assert "\ufffd]0;pwned\ufffdx[/]" in text and "every" not in text


@pytest.mark.parametrize(("auth", "owner", "code"), [
    (["--auth", "munge"], "someone-else", 10),  # signed in as oneself: theirs, refused
    (["--auth", "munge"], None, 5),  # sacct does not know it either: unknown
    ([], "someone-else", 5),  # an admin's report: unknown is unknown
])
def test_top_says_another_users_job_is_not_yours_as_job_does(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        auth: list[str], owner: str | None, code: int) -> None:
    """Through the proxy another user's job has no series: ``top`` says whose it is
    (sacct's owner) and exits 10, as ``job`` does, rather than "no metrics" (5)."""
    import pwd

    from slurm_gpu_exporter.report.cli import main, reports, top

    async def same_ids(_prom: object, _window: object, ids: list[str], _f: object
                       ) -> list[str]:
        return ids

    async def no_series(_prom: object, _window: object, ids: list[str], *_: object
                        ) -> tuple[list[JobDetail], list[str]]:
        return [], ids  # what the proxy answers for a job that is not the user's

    monkeypatch.setattr(top, "resolve_array_tasks", same_ids)
    monkeypatch.setattr(top, "job_report", no_series)
    monkeypatch.setattr(top, "listed_jobs", dict)  # Slurm lists no such job: no wait
    monkeypatch.setattr(reports, "sacct_owners",
                        lambda ids: {i: owner for i in ids} if owner else {})
    monkeypatch.setenv("SLURM_GPU_REPORT_CLIENT", "/nonexistent")
    assert main.main(["top", "4242", "--once", "--prometheus-url", "http://127.0.0.1:9",
                      *auth]) == code
    err = capsys.readouterr().err
    me = pwd.getpwuid(os.getuid()).pw_name
    if code == 10:
        assert f"job 4242 is not yours ({me}): the proxy shows each user only" in err, err
    else:
        assert "no metrics for job 4242" in err, err
