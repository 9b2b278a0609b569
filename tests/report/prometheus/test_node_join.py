"""Which Slurm node a series is from: the PromQL that joins the agents'
``slurm_gpu_exporter_node_info`` in, and how enforce, remediate and the reports read
the answer (fixed answers; the real Prometheus side is
test_node_join_slurm.py beside this file)."""

from __future__ import annotations

from slurm_gpu_exporter.report.enforce.idle_window import idle_queries, jobs_from_answers
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.prometheus.client import Sample
from slurm_gpu_exporter.report.prometheus.job_figures import job_queries
from slurm_gpu_exporter.report.prometheus.job_figures import jobs_from_answers as job_answers
from slurm_gpu_exporter.report.prometheus.nodes import join_node, series_node, shown_nodes
from slurm_gpu_exporter.report.prometheus.queries import Filters
from slurm_gpu_exporter.report.remediate.confirm import Episode, Firing
from slurm_gpu_exporter.report.remediate.remediator import Remediator
from slurm_gpu_exporter.report.slurm.actions import SlurmNode

NOW = 1_800_000_000.0
INFO = "slurm_gpu_exporter_node_info"


def test_the_join_keeps_series_of_agents_that_name_no_node() -> None:
    assert join_node("last_over_time(x[5m])", ("instance", "cluster"), INFO, "1h") == (
        "((last_over_time(x[5m])) * on (instance, cluster) group_left (slurm_node) "
        "(max by (instance, cluster, slurm_node) (last_over_time(slurm_gpu_exporter_node_info"
        "[1h])) and on (instance, cluster) (count by (instance, cluster) "
        "(max by (instance, cluster, slurm_node) (last_over_time(slurm_gpu_exporter_node_info"
        "[1h]))) == 1))) or ignoring (slurm_node) (last_over_time(x[5m]))")


def test_a_node_label_of_the_site_wins_then_the_agents_name_then_the_target_host() -> None:
    labels = {"instance": "10.1.2.3:9817", "slurm_node": "gpu01", "node": "gpu01.site:1"}
    assert series_node(labels, "node") == "gpu01.site"
    assert series_node(labels) == "gpu01"
    assert series_node({"instance": "gpu02:9817"}) == "gpu02"
    assert series_node({"instance": "gpu02:9817", "slurm_node": ""}) == "gpu02"
    assert series_node({"instance": "gpu03:9817"}, "node") == "gpu03"  # label absent


def test_two_targets_naming_one_node_are_shown_by_target() -> None:
    shown = shown_nodes([Sample({"instance": "10.0.0.1:9817", "slurm_node": "gpu01"}, 1),
                         Sample({"instance": "10.0.0.2:9817", "slurm_node": "gpu02"}, 1),
                         Sample({"instance": "10.0.0.3:9817", "slurm_node": "gpu02"}, 1),
                         Sample({"instance": "gpu04:9817"}, 1)])
    assert shown == {"10.0.0.1:9817": "gpu01", "10.0.0.2:9817": "10.0.0.2:9817",
                     "10.0.0.3:9817": "10.0.0.3:9817", "gpu04:9817": "gpu04"}


def test_enforce_joins_the_node_into_held_only_without_a_node_label() -> None:
    filters = Filters(cluster="c1")
    joined = idle_queries((60.0,), filters)["held"]
    assert "group_left (slurm_node)" in joined
    assert 'slurm_gpu_exporter_node_info{cluster="c1"}[60s]' in joined
    assert "on (instance, cluster)" in joined
    plain = idle_queries((60.0,), filters, "node")["held"]
    assert plain == 'last_over_time(slurm_job_gpu_allocated_seconds_total{cluster="c1"}[60s])'
    others = {k: v for k, v in idle_queries((60.0,), filters).items() if k != "held"}
    assert not any("slurm_node" in q for q in others.values())


def _held(**extra: str) -> dict[str, list[Sample]]:
    got: dict[str, list[Sample]] = {name: [] for name in idle_queries((60.0,), Filters())}
    got["held"] = [Sample({"jobid": "7", "user": "ann", "instance": "10.0.0.9:9817",
                           "gpu": "0", **extra}, 100.0)]
    return got


def test_enforce_reads_the_node_its_agent_names() -> None:
    [job] = jobs_from_answers(_held(slurm_node="gpu09"), (60.0,), 0.05, NOW)
    assert job.nodes == ["gpu09"]
    [job] = jobs_from_answers(_held(), (60.0,), 0.05, NOW)
    assert job.nodes == ["10.0.0.9"]  # an older agent: the target's host
    [job] = jobs_from_answers(_held(slurm_node="gpu09", node="n9"), (60.0,), 0.05, NOW, "node")
    assert job.nodes == ["n9"]


def test_the_job_report_shows_the_node_its_agent_names() -> None:
    window = Window(NOW - 3600, NOW)
    assert "group_left (slurm_node)" in job_queries(window, ["7"], Filters())["info"]
    got = {"info": [Sample({"jobid": "7", "user": "ann", "instance": "10.0.0.9:9817",
                            "slurm_node": "gpu09"}, 1)],
           "allocated": [Sample({"jobid": "7", "instance": "10.0.0.9:9817", "gpu": "0",
                                 "uuid": "GPU-0"}, 60.0)]}
    [(_, nodes)] = job_answers(got, Filters()).values()
    assert [(n.node, n.target) for n in nodes] == [("gpu09", "10.0.0.9:9817")]


def _remediator(node_label: str | None = None) -> tuple[Remediator, list[str]]:
    drains: list[str] = []
    return Remediator(node_label=node_label, drain=lambda node, _: drains.append(node),
                      lookup=lambda node: SlurmNode(node, "IDLE")
                      if node in ("gpu09", "10.0.0.9") else None), drains


def _alert(**labels: str) -> dict:
    return {"status": "firing", "fingerprint": "f", "startsAt": "t",
            "labels": {"alertname": "SlurmGpuLost", "instance": "10.0.0.9:9817", **labels}}


def test_remediate_drains_the_node_the_alerts_agent_names() -> None:
    firing: Firing = {("SlurmGpuLost", "10.0.0.9:9817"): [Episode.of({
        "alertname": "SlurmGpuLost", "instance": "10.0.0.9:9817", "slurm_node": "gpu09"}, 1.0)]}
    rem, drains = _remediator()
    assert rem.handle(_alert(), firing).text == "drained gpu09"
    assert drains == ["gpu09"]


def test_remediate_without_the_agents_name_takes_the_target_host() -> None:
    firing: Firing = {("SlurmGpuLost", "10.0.0.9:9817"): [
        Episode.of({"instance": "10.0.0.9:9817"}, 1.0)]}
    rem, drains = _remediator()
    assert rem.handle(_alert(), firing).text == "drained 10.0.0.9"
    assert drains == ["10.0.0.9"]


def test_remediate_with_a_node_label_ignores_the_agents_name() -> None:
    firing: Firing = {("SlurmGpuLost", "gpu09"): [
        Episode.of({"node": "gpu09", "slurm_node": "gpu77"}, 1.0)]}
    rem, drains = _remediator("node")
    assert rem.handle(_alert(node="gpu09"), firing).text == "drained gpu09"
    assert drains == ["gpu09"]


def test_remediate_refuses_a_name_from_prometheus_that_is_no_node_name() -> None:
    firing: Firing = {("SlurmGpuLost", "10.0.0.9:9817"): [Episode.of({"slurm_node": "ALL"}, 1.0)]}
    rem, drains = _remediator()
    outcome = rem.handle(_alert(), firing)
    assert (outcome.outcome, outcome.reason) == ("refused", "not_a_node")
    assert drains == []


def test_the_node_joined_in_is_no_part_of_an_episode() -> None:
    """An agent upgraded while its alert fires: the same firing, not a new one."""
    labels = {"alertname": "SlurmGpuLost", "instance": "10.0.0.9:9817", "gpu": "0"}
    assert Episode.of(labels, 1.0) == Episode.of({**labels, "slurm_node": "gpu09"}, 1.0)
    assert Episode.of({**labels, "slurm_node": "gpu09"}, 1.0).node == "gpu09"
