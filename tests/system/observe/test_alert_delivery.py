"""An idle held GPU on the simulated node reaches a receiver through Alertmanager."""

from __future__ import annotations

import time

import pytest

from tests.support import wait_until
from tests.system.observe.conftest import Stack

pytestmark = pytest.mark.prometheus

SIM_NODE = "simnode"  # the simulated agent's Slurm node (slurm_gpu_exporter_node_info)


def wait_for_alert(stack: Stack, want: dict[str, str], timeout: float) -> tuple[str, dict]:
    def received() -> tuple[str, dict] | None:
        return next(((path, alert) for path, alert in stack.webhook.alerts()
                     if all(alert["labels"].get(k) == v for k, v in want.items())), None)

    return wait_until(received, timeout, f"an alert with {want}", poll=0.5, log=lambda: (
        f"received {[(p, a['labels']) for p, a in stack.webhook.alerts()]}\n"
        f"Prometheus alerts: {stack.node.vector('ALERTS')}\n{stack.alertmanager.log()}"))


def held_idle_jobs(stack: Stack) -> dict[str, dict]:
    """Simulated jobs with a GPU held and never busy since the agent started, by jobid."""
    idle = stack.node.wait_for(
        "slurm_job_gpu_busy_seconds_total == 0 and slurm_job_gpu_allocated_seconds_total > 0")
    return {s["metric"]["jobid"]: s["metric"] for s in idle}


def test_idle_gpu_alert_reaches_the_users_receiver_with_job_user_and_gpu(stack: Stack) -> None:
    idle = held_idle_jobs(stack)
    jobid, labels = sorted(idle.items())[0]
    path, alert = wait_for_alert(
        stack, {"alertname": "SlurmJobGpuIdle", "jobid": jobid}, timeout=90)
    assert path == "/users-slack"  # audience=user, warning: the users' route
    got = alert["labels"]
    assert got["user"] == labels["user"] and got["gpu"] == labels["gpu"]
    assert got["severity"] == "warning"
    assert got["cluster"] == stack.cluster  # the node tier's external label
    assert got["account"] and got["partition"]  # joined from slurm_job_info
    assert f"job {jobid} of user {labels['user']}" in alert["annotations"]["description"]
    # The agent is scraped by address; the texts name its Slurm node, and the target.
    assert got["instance"] == f"127.0.0.1:{stack.agent.port}"
    assert f"holds GPU {got['gpu']} on {SIM_NODE} without" in alert["annotations"]["summary"]
    assert f"on {SIM_NODE} (target {got['instance']})," in alert["annotations"]["description"]
    assert alert["status"] == "firing"
    # Only GPUs that never worked: no busy or bursty job's GPU is reported idle.
    reported = {(a["labels"]["jobid"], a["labels"]["gpu"]) for _, a in stack.webhook.alerts()
                if a["labels"]["alertname"] == "SlurmJobGpuIdle"}
    never_busy = {(s["metric"]["jobid"], s["metric"]["gpu"]) for s in stack.node.vector(
        "slurm_job_gpu_busy_seconds_total == 0")}
    assert reported <= never_busy, (reported, never_busy)


def test_low_use_alert_is_sent_for_a_bursty_job_and_inhibited_for_an_idle_one(
        stack: Stack) -> None:
    idle = held_idle_jobs(stack)
    infos = stack.node.vector('slurm_job_info{name="bursty-train"}')
    assert infos, "the simulated node has no bursty job"
    bursty = infos[0]["metric"]["jobid"]
    path, alert = wait_for_alert(
        stack, {"alertname": "SlurmJobLowGpuUse", "jobid": bursty}, timeout=120)
    assert path == "/users-slack"
    assert alert["labels"]["user"] == infos[0]["metric"]["user"]
    assert alert["labels"]["account"] == infos[0]["metric"]["account"]
    assert "%" in alert["annotations"]["summary"]  # its busy share, humanized
    # A job whose GPUs never work has a low busy share too, and its low-use alert fires
    # in Prometheus, but Alertmanager mutes it while the job's idle-GPU alert fires.
    idle_job = next(j for j, labels in idle.items()
                 if stack.node.vector(f'slurm_job_info{{jobid="{j}", name="idle-train"}}'))
    stack.node.wait_for(f'ALERTS{{alertname="SlurmJobLowGpuUse", alertstate="firing", '
                        f'jobid="{idle_job}"}}', timeout=90)
    wait_for_alert(stack, {"alertname": "SlurmJobGpuIdle", "jobid": idle_job}, timeout=30)
    time.sleep(5)  # several group intervals (1 s) for a notification that must not come
    delivered = {a["labels"]["jobid"] for _, a in stack.webhook.alerts()
                 if a["labels"]["alertname"] == "SlurmJobLowGpuUse"}
    assert idle_job not in delivered, delivered
    assert bursty in delivered
