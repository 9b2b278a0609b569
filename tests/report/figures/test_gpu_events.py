"""What slowed a job's GPUs and what went wrong on them, on hand-made truths: the
answers of the one batched query read per GPU (baseline subtracted, Xids first, zero
counts left out), the shares by reason, the GPU a note names, the notes and low-util's
mark. Against a real Prometheus: test_gpu_events_real.py."""

from __future__ import annotations

from slurm_gpu_exporter.report.figures.gpu_events import GpuFault, Throttle
from slurm_gpu_exporter.report.figures.job_events import (
    fault_lines,
    slowdown,
    throttle_lines,
    xid_errors,
)
from slurm_gpu_exporter.report.figures.rules import (
    job_facts,
    load_config,
    low_util_note,
    notes_for,
)
from slurm_gpu_exporter.report.figures.shapes import GpuDetail, JobDetail, JobUsage, NodeDetail
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.prometheus.client import Sample
from slurm_gpu_exporter.report.prometheus.gpu_events import EVENTS, gpu_events
from slurm_gpu_exporter.report.prometheus.job_figures import job_queries
from slurm_gpu_exporter.report.prometheus.queries import Filters, low_util_queries

XID_AT = 1_795_962_180.0  # 2026-11-29 14:23 UTC
GPU = {"jobid": "7", "instance": "n1:9817", "gpu": "3", "uuid": "GPU-3"}


def _s(event: str, value: float, **labels: str) -> Sample:
    return Sample({**GPU, "event": event, **labels}, value)


def _job(*gpus: GpuDetail, nodes: int = 1) -> JobDetail:
    return JobDetail(usage=JobUsage("7", gpus=len(gpus)), now=XID_AT + 3600, accounting=None,
                     nodes=[NodeDetail(f"n{n}", gpus=list(gpus)) for n in range(nodes)])


def test_the_events_answer_is_read_per_gpu_with_the_baseline_subtracted() -> None:
    now = [_s("throttled", 500.0, reason="power"), _s("throttled", 40.0, reason="thermal"),
           _s("ecc", 2.0, type="uncorrected"), _s("xid", 3.0, xid="79"),
           _s("xid_last", XID_AT, xid="79"), _s("pcie_replays", 4.0),
           _s("nvlink", 0.0, kind="crc"), _s("other", 9.0)]
    before = [_s("throttled", 100.0, reason="power"), _s("xid", 1.0, xid="79"),
              _s("pcie_replays", 4.0)]
    ((key, (throttled, faults)),) = gpu_events(now, before).items()
    assert key == ("7", "n1:9817", "3", "GPU-3")
    assert throttled == [Throttle("power", 400.0), Throttle("thermal", 40.0)]
    # the PCIe replays all came before the window, the NVLink counter never moved
    assert faults == [GpuFault("xid", "79", 2.0, XID_AT), GpuFault("ecc", "uncorrected", 2.0)]


def test_an_xids_time_is_kept_to_the_millisecond_whichever_store_answered() -> None:
    # Prometheus and VictoriaMetrics answer the same stamp in their last bits apart.
    for answered in (1_796_454_626.7314324, 1_796_454_626.7314322):
        now = [_s("xid", 1.0, xid="79"), _s("xid_last", answered, xid="79")]
        ((_, (_, faults)),) = gpu_events(now, []).items()
        assert faults == [GpuFault("xid", "79", 1.0, 1_796_454_626.731)]


def test_the_events_are_one_query_of_each_report_whatever_the_jobs() -> None:
    window = Window(XID_AT - 86400, XID_AT)
    one, many = job_queries(window, ["7"], Filters()), job_queries(window, ["7", "8", "9"],
                                                                   Filters())
    assert len(one) == len(many)
    events = one["gpu_events"]
    assert all(metric in events for metric, _ in EVENTS.values())
    assert "slurm_job_gpu_xid_last_timestamp_seconds" in events
    assert "xid_last" not in one["gpu_events_base"] and "offset" in one["gpu_events_base"]
    slowed = low_util_queries(window, Filters(user="bob"))["slowed"]
    assert 'reason=~"power|thermal|board_limit|reliability"' in slowed
    assert 'user="bob"' in slowed


def test_shares_of_busy_and_held_time_by_reason_and_the_gpu_the_note_names() -> None:
    gpu = GpuDetail("3", "GPU-3", allocated_s=1000.0, busy_s=400.0, throttled=[
        Throttle("low_utilization", 540.0), Throttle("thermal", 20.0),
        Throttle("power", 92.0), Throttle("board_limit", 1.0)])
    cool = GpuDetail("1", "GPU-1", allocated_s=1000.0, busy_s=900.0,
                     throttled=[Throttle("power", 90.0)])
    detail = _job(cool, gpu)
    assert throttle_lines(detail) == [
        ("1", "power-capped 10% of its busy time (9% of the time held)"),
        ("3", "power-capped 23% of its busy time (9% of the time held); thermally throttled "
              "5% of its busy time (2% of the time held); clocked down as idle 54% of the "
              "time held")]  # board_limit: 0.1 % of the time held, left out
    slow = slowdown(detail)
    assert slow is not None and (slow.gpu, slow.reason) == ("3", "power")
    assert slow.busy_ratio == 0.23 and slow.held_ratio == 0.092
    assert slowdown(_job(GpuDetail("0", "u", 10.0, 0.0, throttled=[Throttle("power", 5.0)]))
                    ) is None  # never busy: no share of busy time to speak of


def test_the_notes_name_the_throttled_gpu_and_the_xid_with_its_time() -> None:
    gpu = GpuDetail("3", "GPU-3", allocated_s=3600.0, busy_s=3000.0,
                    throttled=[Throttle("power", 690.0)],
                    faults=[GpuFault("ecc", "corrected", 12.0),
                            GpuFault("xid", "79", 1.0, XID_AT)])
    detail = _job(gpu, nodes=2)
    config = load_config(None)
    facts = job_facts(detail, config)
    assert facts["gpu_xid_errors"] == 2  # one on each node
    notes = notes_for(facts, config.notes)
    assert notes[0].startswith("The GPUs reported errors while the job ran (Xid 79 at "
                               "14:23 UTC on GPU 3 on n0; Xid 79 at 14:23 UTC on GPU 3 on n1;")
    assert ("GPU 3 on n0 was power-capped 23% of the time it was busy: the GPU, not the "
            "job's code, held it back. Tell the admins if it recurs.") in notes
    assert fault_lines(_job(gpu))[1] == "12 ECC errors (corrected) on GPU 3"


def test_a_job_slowed_under_a_tenth_of_its_busy_time_or_without_series_gets_no_note(
        ) -> None:
    config = load_config(None)
    mild = _job(GpuDetail("0", "u", 100.0, 100.0, throttled=[Throttle("thermal", 9.0)]))
    old = _job(GpuDetail("0", "u", 100.0, 100.0))  # an agent from before the counters
    for detail in (mild, old):
        assert not [n for n in notes_for(job_facts(detail, config), config.notes)
                    if "busy" in n or "errors" in n]
    assert xid_errors(mild) == 0 and xid_errors(old) is None


def test_low_util_marks_a_job_slowed_by_its_gpu_from_the_configured_share() -> None:
    job = JobUsage("9", allocated_s=1000.0, busy_s=100.0, slowed_s=30.0,
                   slowed_reason="thermal")
    assert low_util_note(job, 0.2) == ("slowed by its GPU rather than idle: thermally "
                                       "throttled 30% of its busy GPU time")
    assert low_util_note(job, 0.5) is None
    assert low_util_note(JobUsage("9", allocated_s=10.0, busy_s=0.0, slowed_s=0.0), 0.2) is None
