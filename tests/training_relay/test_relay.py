"""The relay over a real unix socket, with real sender processes (distinct SO_PEERCRED pids)."""

from __future__ import annotations

import dataclasses
import socket
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from slurm_gpu_exporter.training_relay import RelayLimits, TrainingRelay
from tests.support import wait_until
from tests.training_relay.conftest import series_of

DEMO = "slurm_job_training_demo_value"
ALICE = (("jobid", "101"), ("user", "alice"))
BOB = (("jobid", "202"), ("user", "bob"))
# The relay works through a flood's backlog at its line budget: on a loaded machine that
# takes longer than the default wait (polls return as soon as the condition holds).
FLOOD_WAIT = 30.0


def test_sender_is_credited_to_its_job_and_a_forged_jobid_label_is_replaced(
        relay, jobs, senders):
    sender = senders("client", "3.5", "0.5")
    jobs.by_pid[sender.pid] = ("101", "alice")
    sender.go()
    wait_until(lambda: series_of(relay, DEMO))
    # The payload said jobid="forged", user="mallory"; the agent says who it is.
    assert series_of(relay, DEMO) == {ALICE: 3.5}
    wait_until(lambda: series_of(relay, "slurm_job_training_steps_total"))
    assert series_of(relay, "slurm_job_training_loss") == {ALICE: 3.5}
    assert series_of(relay, "slurm_job_training_learning_rate") == {ALICE: 0.1}
    report = sender.finish()
    assert report["errors"] == 0
    # The exit flush sent the final count.
    wait_until(lambda: series_of(relay, "slurm_job_training_steps_total")[ALICE]
               == report["steps"])
    assert series_of(relay, "slurm_job_training_samples_total")[ALICE] == 8 * report["steps"]
    assert sender.pid in jobs.asked


def test_process_outside_every_job_is_refused_and_counted(relay, jobs, senders):
    outsider = senders("client", "9", "0.3").go()  # its pid is in no job
    report = outsider.finish()
    assert report["dropped"] > 0  # refused: the client saw it and dropped, no raise
    assert relay.families() == []
    assert relay.error_counts()["refused"] >= 1
    assert outsider.pid in jobs.asked


def test_each_jobs_process_is_credited_to_its_own_job(relay, jobs, senders):
    a = senders("client", "1", "0.5")
    b = senders("client", "2", "0.5")
    jobs.by_pid[a.pid] = ("101", "alice")
    jobs.by_pid[b.pid] = ("202", "bob")
    a.go()
    b.go()
    wait_until(lambda: len(series_of(relay, DEMO)) == 2)
    assert series_of(relay, DEMO) == {ALICE: 1.0, BOB: 2.0}
    a.finish()
    b.finish()


def test_forget_drops_the_jobs_series_and_closes_its_connections(relay, jobs, senders):
    a = senders("client", "1", "3")
    b = senders("client", "2", "3")
    jobs.by_pid[a.pid] = ("101", "alice")
    jobs.by_pid[b.pid] = ("202", "bob")
    a.go()
    b.go()
    wait_until(lambda: len(series_of(relay, DEMO)) == 2 and relay.connections() == 2)
    del jobs.by_pid[a.pid]  # the job ended: its processes are in no job any more
    relay.forget("101")
    wait_until(lambda: relay.connections() == 1)
    time.sleep(0.2)  # a few more pushes from both
    assert set(series_of(relay, DEMO)) == {BOB}
    assert "101" not in relay.store.jobs()


def test_merged_families_render_as_text_and_openmetrics(relay, jobs, senders):
    a = senders("client", "1", "0.3")
    jobs.by_pid[a.pid] = ("101", "alice")
    a.go()
    a.finish()
    wait_until(lambda: series_of(relay, "slurm_job_training_steps_total"))

    class Relayed:
        def collect(self):
            return relay.families()

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Relayed())
    text = generate_latest(registry).decode()
    assert 'slurm_job_training_steps_total{jobid="101",user="alice"}' in text
    assert "slurm_job_training_demo_value_created" not in text
    assert "slurm_job_training_process_" not in text  # runtime families left at home
    openmetrics = generate_openmetrics(registry).decode()
    assert "# TYPE slurm_job_training_steps counter" in openmetrics


@pytest.mark.parametrize("limits", [RelayLimits(messages_per_second=5, message_burst=5)])
def test_message_rate_over_the_limit_is_refused_and_counted(spool, jobs, senders, limits):
    frozen = TrainingRelay(spool, jobs, limits=limits, clock=lambda: 100.0)
    frozen.start()  # time stands still: the budget never refills
    try:
        flooder = senders("raw", "small", "1000", "0.2")
        jobs.by_pid[flooder.pid] = ("101", "alice")
        flooder.go().finish()
        wait_until(lambda: frozen.error_counts()["rate"] >= 1)
        assert frozen.store.accepted() == limits.message_burst
        assert series_of(frozen, "slurm_job_training_flood_value") == {ALICE: 5.0}
    finally:
        frozen.stop()


def test_oversized_garbage_and_bad_label_messages_are_refused_and_counted(
        relay, jobs, senders):
    for kind in ("big", "garbage", "badlabels"):
        sender = senders("raw", kind, "15", "0.2")
        jobs.by_pid[sender.pid] = ("101", "alice")
        sender.go().finish()
    wait_until(lambda: relay.error_counts()["labels"] >= 3)
    counts = relay.error_counts()
    assert counts["size"] == 3
    assert counts["parse"] == 3
    # The good series in a message with bad ones is kept.
    assert series_of(relay, "slurm_job_training_ok_value") == {ALICE: 1.0}
    assert not series_of(relay, "slurm_job_training_wide")
    assert not series_of(relay, "slurm_job_training_long")


@pytest.mark.parametrize("limits", [RelayLimits(max_connections_per_job=2)])
def test_connections_over_the_per_job_limit_are_refused_and_counted(relay, jobs, limits):
    import os
    jobs.by_pid[os.getpid()] = ("101", "alice")
    socks = []
    for _ in range(3):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.connect(relay.path)
        socks.append(sock)
    wait_until(lambda: relay.error_counts()["connections"] == 1)
    assert relay.connections() == 2
    for sock in socks:
        sock.close()


def test_a_flood_leaves_the_store_bounded_and_other_jobs_served(relay, jobs, senders):
    """Up to 10,000 messages/s, oversized messages and 100,000 series from one job, for 2 s."""
    flooders = [senders("raw", "small", "10000", "2"), senders("raw", "big", "1000", "2"),
                senders("raw", "series", "50", "2")]
    for flooder in flooders:
        jobs.by_pid[flooder.pid] = ("666", "mallory")
    good = senders("client", "7", "8")  # runs past the flood and the checks after it
    jobs.by_pid[good.pid] = ("101", "alice")
    good.go()
    wait_until(lambda: series_of(relay, "slurm_job_training_steps_total"), FLOOD_WAIT)
    for flooder in flooders:
        flooder.go()
    small, big, series = (flooder.finish() for flooder in flooders)
    # A flood whatever the machine: five times what the job's budget lets through in the
    # 2 s (the sender's 10,000 a second is what it aims at, not what it must reach).
    budget = relay.limits.message_burst + 2 * relay.limits.messages_per_second
    assert small["attempts"] >= 5 * budget, small
    # and far more new series than the job may hold (1,000 in each message)
    assert series["attempts"] * 1000 >= 100 * relay.limits.max_series_per_job, series
    assert big["sent"] > 0
    wait_until(lambda: relay.error_counts()["rate"] > 0, FLOOD_WAIT)
    # The other job's pushes still land: its step counter keeps rising.
    before = series_of(relay, "slurm_job_training_steps_total")[ALICE]
    wait_until(lambda: series_of(relay, "slurm_job_training_steps_total")[ALICE] > before,
               FLOOD_WAIT)
    # Over its rate, the job's oversized and many-series messages may all lose the race
    # for its budget to the small ones (counted under "rate"): a few more of each kind
    # once the flood is over, when the budget has refilled.
    for reason, kind in (("size", "big"), ("series", "series")):
        if relay.error_counts()[reason] == 0:
            time.sleep(1.0)  # let the job's rate budget refill
            late = senders("raw", kind, "5", "1")
            jobs.by_pid[late.pid] = ("666", "mallory")
            late.go().finish()
        wait_until(lambda reason=reason: relay.error_counts()[reason] > 0, FLOOD_WAIT)
    good.finish()
    assert relay.store.jobs()["666"] <= relay.limits.max_series_per_job
    assert relay.store.jobs()["101"] < 20


def test_socket_is_world_connectable_and_replaced_on_restart(spool, jobs):
    import os
    import stat
    first = TrainingRelay(spool, jobs)
    first.start()
    assert stat.S_IMODE(os.stat(first.path).st_mode) == 0o666
    second = TrainingRelay(spool, jobs)
    second.start()  # a restarted agent takes the path over
    first.stop()  # and the old one leaves the new socket in place
    assert stat.S_ISSOCK(os.stat(second.path).st_mode)
    second.stop()
    assert not os.path.exists(second.path)
    assert os.listdir(spool) == []


def test_too_long_socket_path_is_a_clear_error(tmp_path, jobs):
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    with pytest.raises(ValueError, match="too long"):
        TrainingRelay(deep, jobs).start()


def test_limits_are_a_frozen_value():
    with pytest.raises(dataclasses.FrozenInstanceError):
        RelayLimits().max_labels = 1  # type: ignore[misc]


def test_a_scripts_mlflow_run_is_tagged_once_and_shown_with_the_jobs_identity(
        relay, jobs, senders, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "101")
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "alpha")
    run_id = "0123456789abcdef0123456789abcdef"
    sender = senders("mlflow", run_id, "1.0")
    jobs.by_pid[sender.pid] = ("101", "alice")
    sender.go()
    wait_until(lambda: series_of(relay, "slurm_job_mlflow_run_info"))
    assert series_of(relay, "slurm_job_mlflow_run_info") == {
        (("experiment_id", "7"), ("jobid", "101"), ("run_id", run_id), ("user", "alice")): 1}
    report = sender.finish()
    assert report["tagged"] == [{"run_id": run_id, "slurm.job_id": "101",
                                 "slurm.cluster": "alpha", "slurm.figures": "pending"}]
