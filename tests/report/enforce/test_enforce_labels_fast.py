"""enforce on answers whose series lack labels (an odd exporter, a relabelling gone wrong):
the series still meet each other by what they lack, nothing is made up, and two het jobs in
one run are each judged whole."""

from __future__ import annotations

from slurm_gpu_exporter.report.enforce.decisions import decide
from slurm_gpu_exporter.report.enforce.idle_window import WindowUsage, jobs_from_answers
from slurm_gpu_exporter.report.prometheus.client import Sample
from tests.report.enforce.test_enforce_decide_fast import POLICY, _job, _slurm

NOW = 1_800_000_000.0
W = 3600.0


def test_series_without_labels_meet_by_what_they_lack() -> None:
    bare = {"held": [Sample({}, 1.0)], "fresh": [Sample({}, NOW)],
            "start": [Sample({}, NOW - 2 * W)], "up": [Sample({}, 1.0)],
            "last_sample": [Sample({}, NOW)], "busy_3600s": [Sample({}, 0.0)],
            "allocated_3600s": [Sample({}, W)], "nvml_3600s": [Sample({}, 1.0)]}
    (job,) = jobs_from_answers(bare, (W,), 0.01, NOW)
    assert (job.jobid, job.user, job.start, job.gpus, job.fresh, job.doubts) == (
        "", "", NOW - 2 * W, [("", "")], [("", "")], [])
    assert job.windows == [WindowUsage(W, True, None)]


def _het(jobid: str, lead: str, offset: int):  # type: ignore[no-untyped-def]
    from slurm_gpu_exporter.model.slurm_id import SlurmJobId

    return _slurm(jobid, ident=SlurmJobId(jobid, het_job_id=lead, het_job_offset=str(offset)))


def test_two_het_jobs_in_one_run_are_each_judged_whole() -> None:
    jobs = [_job("40", idle_windows=3), _job("41"), _job("50", idle_windows=3),
            _job("51", idle_windows=3)]
    listed = {"40": _het("40", "40", 0), "41": _het("41", "40", 1),
              "50": _het("50", "50", 0), "51": _het("51", "50", 1)}
    sent = {j: [NOW - 3600, NOW - 1800] for j in ("40", "41", "50", "51")}
    decisions = decide(jobs, listed, sent, POLICY, NOW)
    assert [(d.jobid, d.action) for d in decisions] == [
        ("40", "skip"), ("41", "none"), ("50", "cancel"), ("51", "skip")]
    assert decisions[3].reason == "goes with the cancel of its het job 50 (under 50+0)"
