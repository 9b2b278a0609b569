"""enforce's decisions at the edges of their checks (one GPU, one second, one cancel),
on fixed query answers; the helpers are test_decisions.py's."""

from __future__ import annotations

from tests.report.test_decisions import H, NOW, FakeJob, run, slurm_of


def test_one_allocated_gpu_without_fresh_series_makes_the_job_doubtful() -> None:
    job = FakeJob("31", age=3 * H, gpus=2)
    sent = {"31": [NOW - 2 * H, NOW - H]}
    assert run([job], sent=sent)["31"].action == "cancel"  # Slurm and the series agree
    decision = run([job], sent=sent, slurm=slurm_of(job, gpus=3))["31"]
    assert (decision.action, decision.doubtful) == ("skip", True)
    assert "Slurm allocated 3 GPU(s), fresh series show 2" in decision.reason
