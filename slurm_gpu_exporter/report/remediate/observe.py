"""``remediate``'s own metrics, at ``GET /metrics``: what it did with each alert and why,
so a refusal (a forged alert, the drain cap) is a series an alert rule can watch."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from slurm_gpu_exporter.report.remediate.budget import DrainBudget

# outcome: drained, dry_run, ignored, refused, failed; reason: a short fixed word.
OUTCOMES = ("drained", "dry_run", "ignored", "refused", "failed")
# jobs on a faulty GPU: signalled, requeued, skipped, failed, dry_run (--requeue-opt).
JOB_ACTIONS = ("signalled", "requeued", "skipped", "failed", "dry_run")


class RemediateMetrics:
    def __init__(self, budget: DrainBudget, clock: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        self.alerts = Counter(
            "slurm_gpu_remediate_alerts", "Alerts remediate received, by what it did and why",
            ["outcome", "reason"], registry=self.registry)
        self.jobs = Counter(
            "slurm_gpu_remediate_jobs", "Jobs on a faulty GPU remediate signalled, "
            "requeued or left, and why (--requeue-opt)", ["action", "reason"],
            registry=self.registry)
        drains = Gauge("slurm_gpu_remediate_drains_in_window",
                       "Drains done in the current --drain-window", registry=self.registry)
        cap = Gauge("slurm_gpu_remediate_max_drains",
                    "Drains allowed per --drain-window (--max-drains)", registry=self.registry)
        drains.set_function(lambda: budget.used(clock()))
        cap.set(budget.max_drains)

    def count(self, outcome: str, reason: str) -> None:
        self.alerts.labels(outcome, reason).inc()

    def count_job(self, action: str, reason: str) -> None:
        self.jobs.labels(action, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

