"""remediate acts once per firing episode as Prometheus knows it (the series and its
active-since time), not once per post: re-posts of the episode (the same alert, a new
fingerprint, extra labels, another start) drain nothing after the admin resumed the
node; a new episode drains. One Slurm look-up per node per post, a cap on alerts per
post, the drain budget spent on drains only, and what was acted on kept across
restarts in a file that stays small."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from slurm_gpu_exporter.report.cli.main import main
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.remediate import memory
from slurm_gpu_exporter.report.remediate.budget import DrainBudget
from slurm_gpu_exporter.report.remediate.confirm import Episode, Firing
from slurm_gpu_exporter.report.remediate.memory import ActedOn
from slurm_gpu_exporter.report.remediate.remediator import Remediator
from slurm_gpu_exporter.report.remediate.webhook import make_app
from slurm_gpu_exporter.report.slurm.actions import SlurmNode

T0 = 1796119200.0  # 2026-12-01T10:00:00Z
T1 = 1796122800.0  # 2026-12-01T11:00:00Z
RULE_LABELS = {"alertname": "SlurmGpuLost", "instance": "gpu07:9817", "gpu": "3",
               "uuid": "GPU-x", "severity": "critical"}


def firing(since: float = T0, **extra: str) -> Firing:
    """Prometheus shows SlurmGpuLost on gpu07, GPU 3, active since ``since``."""
    return {("SlurmGpuLost", "gpu07:9817"): [Episode.of(RULE_LABELS | extra, since)]}


class FakeSlurm:
    """gpu07..gpu09; drains recorded and applied, look-ups counted; ``resume`` is the
    admin's ``scontrol update State=RESUME``."""

    def __init__(self) -> None:
        self.state = {"gpu07": "IDLE", "gpu08": "IDLE", "gpu09": "IDLE"}
        self.drains: list[tuple[str, str]] = []
        self.lookups: list[str] = []

    def lookup(self, node: str) -> SlurmNode | None:
        self.lookups.append(node)
        return SlurmNode(node, self.state[node]) if node in self.state else None

    def drain(self, node: str, reason: str) -> None:
        self.drains.append((node, reason))
        self.state[node] = "IDLE+DRAIN"

    def resume(self, node: str) -> None:
        self.state[node] = "IDLE"


def remediator(slurm: FakeSlurm, state: Path | None = None, **kw: object) -> Remediator:
    return Remediator(drain=slurm.drain, lookup=slurm.lookup, clock=lambda: T1 + 60,
                      acted_on=ActedOn(state), **kw)  # type: ignore[arg-type]


def alert(fingerprint: str = "abc", starts: str = "2026-12-01T10:00:00Z",
          **labels: str) -> dict:
    return {"status": "firing", "fingerprint": fingerprint, "startsAt": starts,
            "labels": RULE_LABELS | labels}


def test_the_same_episode_posted_again_after_the_admin_resumed_drains_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    slurm = FakeSlurm()
    rem = remediator(slurm)
    assert rem.handle(alert(), firing()).text == "drained gpu07"
    slurm.resume("gpu07")
    caplog.set_level(logging.INFO)
    outcome = rem.handle(alert(), firing())
    assert (outcome.outcome, outcome.reason) == ("ignored", "same_episode")
    assert "2026-12-01T10:00:00Z" in outcome.text
    assert len(slurm.drains) == 1 and slurm.state["gpu07"] == "IDLE"
    assert any("acted on this firing before" in r.getMessage() for r in caplog.records)


def test_a_new_fingerprint_extra_labels_or_another_start_of_the_episode_drain_nothing(
        ) -> None:
    """What a poster controls (fingerprint, startsAt, labels Prometheus does not have)
    does not make a new episode; only Prometheus' series and start do."""
    slurm = FakeSlurm()
    rem = remediator(slurm)
    rem.handle(alert(), firing())
    slurm.resume("gpu07")
    reposts = [alert("new-fp"), alert("fp2", starts="2026-12-04T16:00:00Z"),
               alert("fp3", extra="x", cluster="c1"), alert("fp4", gpu="5", uuid="GPU-y")]
    for repost in reposts:
        outcome = rem.handle(repost, firing())
        assert outcome.reason == "same_episode", repost
    assert len(slurm.drains) == 1 and slurm.state["gpu07"] == "IDLE"


def test_a_new_episode_after_the_alert_resolved_drains_again() -> None:
    slurm = FakeSlurm()
    rem = remediator(slurm)
    rem.handle(alert(), firing(T0))
    slurm.resume("gpu07")
    assert rem.handle(alert(), firing(T1)).text == "drained gpu07"
    assert len(slurm.drains) == 2
    assert slurm.drains[1][1].endswith("since 2026-12-01T11:00:00Z")


def test_a_second_series_firing_on_the_resumed_node_is_a_new_episode() -> None:
    """GPU 3's episode was acted on; GPU 5 fails on the node the admin resumed."""
    slurm = FakeSlurm()
    rem = remediator(slurm)
    rem.handle(alert(), firing(T0))
    slurm.resume("gpu07")
    both = {("SlurmGpuLost", "gpu07:9817"): [
        Episode.of(RULE_LABELS, T0), Episode.of(RULE_LABELS | {"gpu": "5"}, T1)]}
    assert rem.handle(alert(), both).text == "drained gpu07"
    assert "gpu 5" in slurm.drains[1][1]


def test_the_reason_names_the_start_prometheus_shows_not_the_posts() -> None:
    slurm = FakeSlurm()
    rem = remediator(slurm)
    rem.handle(alert(starts="2020-01-01T00:00:00Z"), firing(T0))
    (_, reason), = slurm.drains
    assert reason.endswith("since 2026-12-01T10:00:00Z") and "2020" not in reason


def test_a_thousand_alerts_of_one_node_in_one_post_cost_one_look_up_and_one_drain() -> None:
    slurm = FakeSlurm()
    rem = remediator(slurm)
    alerts = [alert(f"fp{i}", extra=str(i)) for i in range(1000)]
    outcomes = rem.decide(alerts, firing())
    assert slurm.lookups == ["gpu07"] and len(slurm.drains) == 1
    assert outcomes[0].text == "drained gpu07"
    assert {o.reason for o in outcomes[1:]} == {"same_drain"} and len(outcomes) == 1000
    slurm.resume("gpu07")
    again = rem.decide(alerts, firing())  # the re-post: no look-up at all
    assert slurm.lookups == ["gpu07"] and {o.reason for o in again} == {"same_episode"}


def test_alerts_past_the_cap_of_a_post_are_refused_and_not_looked_at() -> None:
    slurm = FakeSlurm()
    rem = remediator(slurm, max_alerts=3)
    other = {("SlurmGpuLost", f"{n}:9817"): [Episode.of({"instance": f"{n}:9817"}, T0)]
             for n in ("gpu08", "gpu09")}
    alerts = [alert(f"fp{i}") for i in range(3)] + [
        alert("x8", instance="gpu08:9817"), alert("x9", instance="gpu09:9817")]
    outcomes = rem.decide(alerts, firing() | other)
    assert [o.reason for o in outcomes] == ["drained", "same_drain", "same_drain",
                                            "post_cap", "post_cap"]
    assert outcomes[3].text == "refused: more than 3 alerts in one post"
    assert slurm.lookups == ["gpu07"]
    assert not rem.needs_prometheus([alert() | {"status": "resolved"}] * 3 + alerts)


def test_the_drain_budget_is_spent_on_drains_only() -> None:
    slurm = FakeSlurm()
    rem = remediator(slurm, budget=DrainBudget(max_drains=2, window_s=3600))
    rem.handle(alert(), firing())
    slurm.resume("gpu07")
    for i in range(20):  # re-posts of the episode
        rem.decide([alert(f"fp{i}")] * 5, firing())
    slurm.state["gpu08"] = "MIXED+DRAIN"  # drained by an admin: no drain, no spend
    gpu08 = {("SlurmGpuLost", "gpu08:9817"): [Episode.of({"instance": "gpu08:9817"}, T0)]}
    assert rem.handle(alert(instance="gpu08:9817"), gpu08).reason == "already_drained"
    gpu09 = {("SlurmGpuLost", "gpu09:9817"): [Episode.of({"instance": "gpu09:9817"}, T0)]}
    assert rem.handle(alert(instance="gpu09:9817"), gpu09).text == "drained gpu09"
    assert rem.budget.used(T1 + 60) == 2


def test_what_was_acted_on_survives_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "remediate.json"
    slurm = FakeSlurm()
    remediator(slurm, state).handle(alert(), firing())
    slurm.resume("gpu07")
    restarted = remediator(slurm, state)
    assert restarted.handle(alert("new-fp"), firing()).reason == "same_episode"
    assert len(slurm.drains) == 1
    assert state.stat().st_mode & 0o777 == 0o600


def test_the_state_forgets_old_episodes_and_keeps_at_most_its_cap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "remediate.json"
    acted = ActedOn(state)
    acted.remember([Episode.of({"gpu": "0"}, T0)], T0)
    acted.remember([Episode.of({"gpu": "1"}, T0)], T0 + memory.RETAIN_S)
    assert [e["labels"] for e in json.loads(state.read_text())["episodes"]] == [{"gpu": "1"}]
    monkeypatch.setattr(memory, "MAX_EPISODES", 3)
    for i in range(10):
        acted.remember([Episode.of({"gpu": str(i)}, T1)], T0 + memory.RETAIN_S + i)
    kept = {e["labels"]["gpu"] for e in json.loads(state.read_text())["episodes"]}
    assert kept == {"7", "8", "9"} and len(ActedOn(state)) == 3


def test_a_repeat_keeps_a_long_episode_known() -> None:
    acted = ActedOn(None)
    episode = Episode.of({"gpu": "0"}, T0)
    acted.remember([episode], T0)
    acted.heard_of([episode], T0 + memory.RETAIN_S - 60)  # Alertmanager's repeat
    acted.remember([], T0 + memory.RETAIN_S + 60)
    assert episode in acted


def test_a_broken_state_file_stops_the_start(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "remediate.json"
    state.write_text('{"episodes": [{"labels": {}}]}')
    with pytest.raises(ReportError, match="remediate state"):
        ActedOn(state)
    code = main(["remediate", "--state-file", str(state), "--prometheus-url",
                 "http://127.0.0.1:9"])
    assert code == 2 and "cannot read the remediate state" in capsys.readouterr().err
    code = main(["remediate", "--max-alerts-per-post", "0", "--prometheus-url",
                 "http://127.0.0.1:9"])
    assert code == 2 and "--max-alerts-per-post" in capsys.readouterr().err


def test_a_post_of_many_alerts_asks_prometheus_once_and_counts_each() -> None:
    slurm = FakeSlurm()
    rem = remediator(slurm, max_alerts=100)
    asked: list[int] = []

    async def confirm() -> Firing:
        asked.append(1)
        return firing()

    async def run() -> tuple[list[str], str]:
        async with TestClient(TestServer(make_app(rem, confirm))) as client:
            body = {"alerts": [alert(f"fp{i}") for i in range(150)]}
            results = (await (await client.post("/alerts", json=body)).json())["results"]
            return results, await (await client.get("/metrics")).text()

    async def resolved_only() -> list[str]:
        async with TestClient(TestServer(make_app(rem, confirm))) as client:
            body = {"alerts": [alert() | {"status": "resolved"}]}
            return (await (await client.post("/alerts", json=body)).json())["results"]

    results, metrics = asyncio.run(run())
    assert len(asked) == 1 and slurm.lookups == ["gpu07"] and len(results) == 150
    assert asyncio.run(resolved_only())[0].startswith("ignored: not firing")
    assert len(asked) == 1  # nothing to confirm: Prometheus not asked
    for reason, count in (("drained", 1), ("same_drain", 99), ("post_cap", 50)):
        assert f'reason="{reason}"}} {count:.1f}' in metrics, reason
