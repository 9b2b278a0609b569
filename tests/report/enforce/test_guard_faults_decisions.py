"""enforce's decisions at the edges of their checks (one GPU, one second, one cancel),
on fixed query answers; the helpers are test_decisions.py's."""

from __future__ import annotations

from slurm_gpu_exporter.report.enforce.decisions import decide
from slurm_gpu_exporter.report.enforce.idle_window import jobs_from_answers
from slurm_gpu_exporter.report.prometheus.client import Sample
from tests.report.enforce.test_decisions import (
    NOW,
    POLICY,
    WINDOWS,
    FakeJob,
    H,
    answers,
    run,
    slurm_of,
)


def test_one_allocated_gpu_without_fresh_series_makes_the_job_doubtful() -> None:
    job = FakeJob("31", age=3 * H, gpus=2)
    sent = {"31": [NOW - 2 * H, NOW - H]}
    assert run([job], sent=sent)["31"].action == "cancel"  # Slurm and the series agree
    decision = run([job], sent=sent, slurm=slurm_of(job, gpus=3))["31"]
    assert (decision.action, decision.doubtful) == ("skip", True)
    assert "Slurm allocated 3 GPU(s), fresh series show 2" in decision.reason


def test_a_node_whose_series_went_stale_is_named_as_missing() -> None:
    # Job 32 on two nodes, one GPU each; gpu02's series stopped 20 minutes ago.
    parts = [FakeJob("32", age=3 * H, instance="gpu01:9817"),
             FakeJob("32", age=3 * H, instance="gpu02:9817")]
    got = answers(parts)
    got["fresh"] = [Sample(s.labels, NOW - 1200 if s.labels["instance"] == "gpu02:9817"
                           else s.value) for s in got["fresh"]]
    seen = jobs_from_answers(got, WINDOWS, POLICY.busy_fraction, NOW)
    slurm = slurm_of(parts[0], nodes=("gpu01", "gpu02"), gpus=2)
    (decision,) = decide(seen, slurm, {"32": [NOW - 2 * H, NOW - H]}, POLICY, NOW)
    assert (decision.action, decision.doubtful) == ("skip", True)
    assert "Slurm runs it on gpu02 too, with no fresh series" in decision.reason
