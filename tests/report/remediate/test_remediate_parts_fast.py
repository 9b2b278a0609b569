"""remediate's small parts at their edges, each against values worked out by hand: the
drain budget's window, the firing query and its answer, which series hold a GPU, the
files of episodes acted on and of requeues due (what they hold, when they forget, what a
broken one says), and the counters at /metrics."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import pytest

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.prometheus.client import Sample
from slurm_gpu_exporter.report.remediate import memory, pending
from slurm_gpu_exporter.report.remediate.budget import DrainBudget
from slurm_gpu_exporter.report.remediate.confirm import Episode, firing_alerts, firing_query
from slurm_gpu_exporter.report.remediate.holders import holders, holders_query, holds
from slurm_gpu_exporter.report.remediate.memory import ActedOn
from slurm_gpu_exporter.report.remediate.observe import RemediateMetrics
from slurm_gpu_exporter.report.remediate.pending import (
    PendingRequeue,
    RequeueBook,
    episode_key,
    requeue_state_path,
)
from slurm_gpu_exporter.report.remediate.state_file import load_state, save_state

NOW = 1796119200.0  # 2026-12-01T10:00:00Z
DAY = 86400.0


# -- the drain budget ---------------------------------------------------------------

def test_a_drain_leaves_the_window_exactly_its_length_later() -> None:
    budget = DrainBudget(max_drains=2, window_s=100.0)
    assert budget.allows(0.0) and budget.used(0.0) == 0
    budget.spend(0.0)
    budget.spend(10.0)
    assert budget.used(99.9) == 2 and not budget.allows(99.9)
    assert budget.used(100.0) == 1 and budget.allows(100.0)
    assert budget.used(110.0) == 0


def test_the_default_budget_is_two_drains_an_hour() -> None:
    budget = DrainBudget()
    budget.spend(0.0)
    budget.spend(1.0)
    assert not budget.allows(3599.0) and budget.allows(3600.0)


# -- what Prometheus says fires ---------------------------------------------------------

def test_an_episode_is_the_series_labels_without_name_state_or_node() -> None:
    episode = Episode.of({"__name__": "ALERTS_FOR_STATE", "alertstate": "firing",
                          "slurm_node": "gpu07", "gpu": "1", "alertname": "A"}, NOW)
    assert episode.labels == (("alertname", "A"), ("gpu", "1"))
    assert episode.node == "gpu07" and episode.since == NOW
    assert episode == Episode.of({"alertname": "A", "gpu": "1", "slurm_node": "other"}, NOW)
    assert Episode.of({"gpu": "1"}, NOW).node == ""
    assert episode.label("gpu") == "1" and episode.label("uuid") == ""
    assert episode.label("uuid", "?") == "?"
    assert episode.since_text == "2026-12-01T10:00:00Z"


def test_the_firing_query_picks_the_allowed_alerts_that_fire() -> None:
    assert firing_query(["B:x", "A.b"]) == (
        'ALERTS_FOR_STATE{alertname=~"A\\\\.b|B:x"} and ignoring(alertstate) '
        'ALERTS{alertstate="firing",alertname=~"A\\\\.b|B:x"}')


class _Prometheus:
    def __init__(self, samples: list[Sample]) -> None:
        self.samples = samples
        self.asked: list[tuple[str, float]] = []

    async def instant(self, query: str, at: float) -> list[Sample]:
        self.asked.append((query, at))
        return self.samples


def test_the_firing_alerts_are_read_by_name_and_node_label() -> None:
    prom = _Prometheus([
        Sample({"alertname": "A", "host": "gpu07", "gpu": "0"}, NOW - 60),
        Sample({"alertname": "A", "host": "gpu07", "gpu": "1"}, NOW - 30),
        Sample({"host": "gpu08"}, NOW - 10),  # no alert name
        Sample({"alertname": "A", "gpu": "2"}, NOW),  # no node label: nothing
        Sample({"alertname": "A", "host": "gpu09"}, float("nan")),  # no time
    ])
    firing = asyncio.run(firing_alerts(prom, ["A"], "host", now=NOW))
    assert firing == {
        ("A", "gpu07"): [Episode.of({"alertname": "A", "host": "gpu07", "gpu": "0"}, NOW - 60),
                         Episode.of({"alertname": "A", "host": "gpu07", "gpu": "1"}, NOW - 30)],
        ("", "gpu08"): [Episode.of({"host": "gpu08"}, NOW - 10)]}
    assert prom.asked == [(firing_query(["A"]), NOW)]


def test_without_a_node_label_the_target_is_joined_to_its_agents_node() -> None:
    prom = _Prometheus([Sample({"alertname": "A", "instance": "gpu07:9817",
                                "slurm_node": "n7"}, NOW)])
    firing = asyncio.run(firing_alerts(prom, ["A"], None, now=NOW))
    assert [e.node for e in firing[("A", "gpu07:9817")]] == ["n7"]
    q = firing_query(["A"])
    info = "last_over_time(slurm_gpu_exporter_node_info[15m])"
    assert prom.asked[0][0] == (
        f"(({q}) * on (instance) group_left (slurm_node) (max by (instance, slurm_node) "
        f"({info}) and on (instance) (count by (instance) (max by (instance, slurm_node) "
        f"({info})) == 1))) or ignoring (slurm_node) ({q})")


def test_without_a_time_prometheus_is_asked_about_now() -> None:
    prom = _Prometheus([])
    asyncio.run(firing_alerts(prom, ["A"], "host"))
    assert abs(prom.asked[0][1] - time.time()) < 60


# -- which series hold the GPU -------------------------------------------------------

def test_the_holders_query_takes_the_sites_node_label_too() -> None:
    episode = Episode.of({"instance": "gpu07:9817", "cluster": "west", "host": "gpu07",
                          "job": ""}, NOW)
    assert holders_query(episode, "host") == (
        'timestamp(slurm_job_gpu_allocated_seconds_total{cluster="west",host="gpu07",'
        'instance="gpu07:9817"})')
    only_node = Episode.of({"host": "gpu07"}, NOW)
    assert holders_query(only_node, "host") == (
        'timestamp(slurm_job_gpu_allocated_seconds_total{host="gpu07"})')
    assert holders_query(only_node, None) is None
    assert holders_query(Episode.of({"cluster": "west"}, NOW), "host") is None


@pytest.mark.parametrize(("alert", "series", "held"), [
    ({"gpu": "1", "uuid": "U1"}, {"gpu": "1", "uuid": "U1"}, True),
    ({"gpu": "1", "uuid": "U1"}, {"gpu": "1", "uuid": "U2"}, False),
    ({"gpu": "1"}, {"gpu": "1", "uuid": "U2"}, True),
    ({"uuid": "U1"}, {"gpu": "5", "uuid": "U1"}, True),
    ({"uuid": "U1"}, {"gpu": "5"}, False),
    ({}, {"gpu": "", "uuid": ""}, False),
    ({"gpu": "3"}, {"gpu": "3.1"}, True),  # a MIG instance of the faulty GPU
    ({"gpu": "3"}, {"gpu": "31"}, False),
    ({"gpu": "3.1"}, {"gpu": "3.1.2"}, False),
    ({"gpu": "3"}, {}, False),
])
def test_a_series_holds_the_alerts_gpu(alert: dict[str, str], series: dict[str, str],
                                       held: bool) -> None:
    assert holds(series, Episode.of(alert, NOW)) is held


def test_a_series_is_fresh_up_to_its_bound() -> None:
    episode = Episode.of({"gpu": "0"}, NOW)
    samples = [Sample({"jobid": "1", "gpu": "0"}, NOW - 120.0),
               Sample({"jobid": "2", "gpu": "0"}, NOW - 120.5),
               Sample({"gpu": "0"}, NOW)]
    assert holders(samples, episode, NOW) == {"1"}
    assert holders(samples, episode, NOW, fresh_s=121.0) == {"1", "2"}


# -- the episodes acted on -------------------------------------------------------------

def _episode(gpu: str, since: float = NOW) -> Episode:
    return Episode.of({"alertname": "A", "instance": "gpu07:9817", "gpu": gpu}, since)


def test_episodes_acted_on_are_written_whole_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "state" / "remediate.json"
    acted = ActedOn(path)
    acted.remember([_episode("0"), _episode("1", NOW - 5)], NOW)
    assert json.loads(path.read_text()) == {"episodes": [
        {"labels": {"alertname": "A", "gpu": "0", "instance": "gpu07:9817"},
         "since": NOW, "seen": NOW},
        {"labels": {"alertname": "A", "gpu": "1", "instance": "gpu07:9817"},
         "since": NOW - 5, "seen": NOW}]}
    again = ActedOn(path)
    assert len(again) == 2 and _episode("1", NOW - 5) in again
    assert _episode("1", NOW) not in again


def test_an_episode_is_forgotten_a_week_after_it_was_last_heard_of() -> None:
    acted = ActedOn(None)
    acted.remember([_episode("0")], NOW)
    acted.remember([_episode("1")], NOW + 7 * DAY - 1)
    assert _episode("0") in acted
    acted.remember([], NOW + 7 * DAY)
    assert _episode("0") not in acted and _episode("1") in acted


def test_a_repeat_refreshes_an_episode_at_most_hourly(tmp_path: Path) -> None:
    path = tmp_path / "remediate.json"
    acted = ActedOn(path)
    acted.remember([_episode("0")], NOW)
    acted.heard_of([_episode("0"), _episode("9")], NOW + 3599)
    assert json.loads(path.read_text())["episodes"][0]["seen"] == NOW
    acted.heard_of([_episode("0"), _episode("9")], NOW + 3600)
    assert json.loads(path.read_text())["episodes"] == [
        {"labels": {"alertname": "A", "gpu": "0", "instance": "gpu07:9817"},
         "since": NOW, "seen": NOW + 3600}]


def test_at_most_the_cap_of_episodes_is_kept_the_newest(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.setattr(memory, "MAX_EPISODES", 2)
    acted = ActedOn(None)
    acted.remember([_episode("0")], NOW)
    acted.remember([_episode("1")], NOW + 2)
    acted.remember([_episode("2")], NOW + 1)
    assert len(acted) == 2 and _episode("0") not in acted


def test_an_unreadable_episode_file_stops_the_start_saying_what_it_would_do(
        tmp_path: Path) -> None:
    path = tmp_path / "remediate.json"
    path.write_text('{"episodes": [{"labels": {}, "since": 1}]}')
    with pytest.raises(ReportError) as caught:
        ActedOn(path)
    assert str(caught.value) == (
        f"cannot read the remediate state {path}: 'seen'; fix it or move it away (alerts "
        "acted on would drain their node again)")
    assert caught.value.exit_code == 2


# -- the requeue book --------------------------------------------------------------------

def _due(key: str = "10@1", due: float = NOW + 120) -> PendingRequeue:
    return PendingRequeue(key, "10", 1.0, due, "gpu07", "why")


def test_the_requeue_book_lives_beside_the_state_file() -> None:
    assert requeue_state_path(Path("/var/lib/x/remediate.json")) == Path(
        "/var/lib/x/remediate.requeue.json")


def test_an_episode_is_keyed_by_its_labels_and_start() -> None:
    assert episode_key(_episode("1", 5.0)) == (
        '[[["alertname", "A"], ["gpu", "1"], ["instance", "gpu07:9817"]], 5.0]')


def test_the_book_is_written_whole_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "remediate.requeue.json"
    book = RequeueBook(path)
    book.acted("10@1", NOW, _due())
    book.acted("11@1", NOW, None)
    book.opened([_episode("0")], NOW)
    assert json.loads(path.read_text()) == {
        "done": {"10@1": NOW, "11@1": NOW},
        "open": {episode_key(_episode("0")): NOW},
        "pending": [{"key": "10@1", "target": "10", "start": 1.0, "due": NOW + 120,
                     "node": "gpu07", "why": "why"}]}
    again = RequeueBook(path)
    assert again.pending == {"10@1": _due()}
    assert again.done == {"10@1": NOW, "11@1": NOW} and "11@1" in again
    assert again.is_open(_episode("0")) and again.opened_at(_episode("0")) == NOW
    assert again.opened_at(_episode("1")) is None and not again.is_open(_episode("1"))


def test_a_book_of_an_earlier_release_has_no_open_episodes(tmp_path: Path) -> None:
    path = tmp_path / "remediate.requeue.json"
    path.write_text('{"done": {"9@1": 5}, "pending": []}')
    book = RequeueBook(path)
    assert book.open == {} and book.done == {"9@1": 5.0}


def test_an_unreadable_book_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "remediate.requeue.json"
    path.write_text("{not json")
    with pytest.raises(ReportError) as caught:
        RequeueBook(path)
    assert str(caught.value).startswith(f"cannot read the requeue state {path}: Expecting")
    assert str(caught.value).endswith("; fix it or move it away (jobs signalled would be "
                                      "signalled again, due requeues lost)")


def test_opening_writes_only_new_episodes_and_settling_only_open_ones(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    book = RequeueBook(path)
    book.opened([_episode("0")], NOW)
    book.opened([_episode("0"), _episode("1")], NOW + 5)
    assert book.open == {episode_key(_episode("0")): NOW, episode_key(_episode("1")): NOW + 5}
    path.unlink()
    book.opened([_episode("0")], NOW + 9)  # nothing new: no write
    book.settled([_episode("7")])  # nothing open: no write
    book.finished("nothing due")
    assert not path.exists()
    book.settled([_episode("0")])
    assert json.loads(path.read_text())["open"] == {episode_key(_episode("1")): NOW + 5}


def test_a_finished_requeue_leaves_the_book(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    book = RequeueBook(path)
    book.acted("10@1", NOW, _due())
    book.finished("10@1")
    assert book.pending == {} and json.loads(path.read_text())["pending"] == []


def test_the_book_forgets_old_jobs_but_not_due_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    book = RequeueBook(None)
    book.acted("old@1", NOW, None)
    book.acted("due@1", NOW, _due("due@1"))
    book.opened([_episode("0")], NOW)
    book.acted("new@1", NOW + 7 * DAY - 1, None)
    assert set(book.done) == {"old@1", "due@1", "new@1"} and book.open
    book.acted("last@1", NOW + 7 * DAY, None)
    assert set(book.done) == {"due@1", "new@1", "last@1"} and book.open == {}
    monkeypatch.setattr(pending, "MAX_KEYS", 2)
    book.acted("z@1", NOW + 7 * DAY + 2, None)
    assert set(book.done) == {"last@1", "z@1"}


# -- the state files --------------------------------------------------------------------

def test_a_state_file_not_there_yet_is_nothing(tmp_path: Path) -> None:
    got: list[object] = []
    load_state(tmp_path / "none.json", "x", "y", got.append)
    assert got == []


def test_a_state_file_that_cannot_be_written_is_logged_and_kept_in_memory(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.ERROR):
        save_state(blocker / "state.json", {"a": 1}, "the requeue state", "it is lost")
    assert [r.getMessage() for r in caplog.records] == [
        f"cannot write the requeue state in {blocker}: File exists: it is lost"]


def test_a_state_file_is_sorted_json_with_a_newline(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    save_state(path, {"b": 1, "a": [2]}, "x", "y")
    assert path.read_text() == '{\n "a": [\n  2\n ],\n "b": 1\n}\n'
    assert path.stat().st_mode & 0o777 == 0o600
    save_state(None, {"a": 1}, "x", "y")  # a dry run writes nothing


# -- the counters ------------------------------------------------------------------------

def test_the_counters_show_outcomes_jobs_and_the_budget() -> None:
    budget = DrainBudget(max_drains=3, window_s=100.0)
    budget.spend(NOW - 50)
    metrics = RemediateMetrics(budget, lambda: NOW)
    metrics.count("refused", "unconfirmed")
    metrics.count_job("signalled", "USR1")
    text = metrics.render().decode()
    for line in (
            'slurm_gpu_remediate_alerts_total{outcome="refused",reason="unconfirmed"} 1.0',
            'slurm_gpu_remediate_jobs_total{action="signalled",reason="USR1"} 1.0',
            "slurm_gpu_remediate_drains_in_window 1.0", "slurm_gpu_remediate_max_drains 3.0",
            "# HELP slurm_gpu_remediate_alerts_total Alerts remediate received, by what it "
            "did and why",
            "# HELP slurm_gpu_remediate_jobs_total Jobs on a faulty GPU remediate signalled, "
            "requeued or left, and why (--requeue-opt)",
            "# HELP slurm_gpu_remediate_drains_in_window Drains done in the current "
            "--drain-window",
            "# HELP slurm_gpu_remediate_max_drains Drains allowed per --drain-window "
            "(--max-drains)"):
        assert line in text.splitlines()
