"""remediate's choices on fixed alerts (the drain recorded, not run; Prometheus's answer and
Slurm's node list given), enforce's state file, and the flags enforce refuses before
asking anyone anything."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from slurm_gpu_exporter.report.cli.main import main
from slurm_gpu_exporter.report.cli.remediate import check_exposure
from slurm_gpu_exporter.report.enforce.state import EnforceState
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.inert_text import slurm_value
from slurm_gpu_exporter.report.remediate.budget import DrainBudget
from slurm_gpu_exporter.report.remediate.confirm import Episode, Firing, firing_query
from slurm_gpu_exporter.report.remediate.remediator import Remediator
from slurm_gpu_exporter.report.remediate.webhook import make_app
from slurm_gpu_exporter.report.slurm.actions import SlurmNode, checked_node
from slurm_gpu_exporter.web.config import TlsSettings, WebConfig

# What Prometheus has firing: SlurmGpuLost on gpu07's agent, GPU 3, active since
# 2026-12-01T10:00:00Z.
SINCE = 1796119200.0
FIRING: Firing = {("SlurmGpuLost", "gpu07:9817"): [Episode.of({
    "alertname": "SlurmGpuLost", "instance": "gpu07:9817", "gpu": "3", "uuid": "GPU-x",
    "severity": "critical"}, SINCE)]}
SLURM_NODES = ("gpu07", "gpu08", "gpu09", "gpu10")


def remediator(state: str = "IDLE", budget: DrainBudget | None = None
               ) -> tuple[Remediator, list[tuple[str, str]]]:
    drains: list[tuple[str, str]] = []

    def lookup(node: str) -> SlurmNode | None:
        return SlurmNode(node, state) if node in SLURM_NODES else None

    return Remediator(drain=lambda node, reason: drains.append((node, reason)),
                      lookup=lookup, budget=budget or DrainBudget(),
                      clock=lambda: 1000.0), drains


def alert(name: str = "SlurmGpuLost", status: str = "firing", **labels: str) -> dict:
    return {"status": status, "fingerprint": "abc", "startsAt": "2026-12-01T10:00:00Z",
            "labels": {"alertname": name, "instance": "gpu07:9817", "gpu": "3",
                       "uuid": "GPU-x", **labels}}


def handle(rem: Remediator, one: dict, firing: Firing | None = FIRING) -> str:
    return rem.handle(one, firing).text


def test_allowed_firing_alert_drains_the_node_of_its_instance_once() -> None:
    rem, drains = remediator()
    assert handle(rem, alert()) == "drained gpu07"
    assert handle(rem, alert()) == ("ignored: acted on this firing of the alert before "
                                    "(SlurmGpuLost since 2026-12-01T10:00:00Z)")
    assert len(drains) == 1
    node, reason = drains[0]
    assert node == "gpu07" and "SlurmGpuLost" in reason and "gpu 3" in reason


def test_node_already_drained_keeps_its_reason() -> None:
    rem, drains = remediator(state="MIXED+DRAIN")
    assert handle(rem, alert()).startswith("ignored: gpu07 is already")
    assert drains == []


def test_resolved_unlisted_and_hostile_alerts_drain_nothing() -> None:
    rem, drains = remediator()
    assert handle(rem, alert(status="resolved")).startswith("ignored: not firing")
    assert handle(rem, alert("SlurmGpuTemperatureHigh")) == \
        "ignored: alert not in the allow-list"
    for bad in ("-h", "gpu07 State=RESUME", "gpu07,gpu08", "gpu[07-10]", "", "a" * 200,
                "ALL", "all:9817"):
        assert handle(rem, alert(instance=bad)) == "refused: not a node name", bad
    assert drains == []


def test_forged_alert_that_prometheus_does_not_show_firing_drains_nothing() -> None:
    """Issue 33's forged post: SlurmGpuLost for a node whose agent raised no such alert
    (gpu-node-17; gpu08, a node Slurm knows; gpu07 with another alert name)."""
    rem, drains = remediator()
    for forged in (alert(instance="gpu-node-17:9817"), alert(instance="gpu08:9817"),
                   alert("SlurmGpuEccUncorrected")):
        outcome = rem.handle(forged, FIRING)
        assert (outcome.outcome, outcome.reason) == ("refused", "unconfirmed"), forged
        assert "Prometheus shows no firing" in outcome.text
    assert drains == []


def test_without_an_answer_from_prometheus_nothing_is_drained() -> None:
    rem, drains = remediator()
    outcome = rem.handle(alert(), None)
    assert (outcome.outcome, outcome.reason) == ("refused", "prometheus_unavailable")
    assert drains == []


def test_node_slurm_does_not_list_under_that_exact_name_is_refused() -> None:
    rem, drains = remediator()
    firing = {("SlurmGpuLost", "gpus:9817"): [Episode.of({"gpu": "0"}, SINCE)]}  # a NodeSet
    outcome = rem.handle(alert(instance="gpus:9817"), firing)
    assert (outcome.outcome, outcome.reason) == ("refused", "unknown_node")
    assert outcome.text == "refused: Slurm lists no node named gpus"
    assert drains == []


def test_names_for_many_nodes_never_reach_a_slurm_command() -> None:
    for bad in ("ALL", "all", "gpu[1-4]", "gpu1,gpu2", "-h"):
        with pytest.raises(ReportError):
            checked_node(bad)


def test_drains_past_the_cap_of_the_window_are_refused_then_allowed_again() -> None:
    budget = DrainBudget(max_drains=2, window_s=3600)
    rem, drains = remediator(budget=budget)
    firing = {("SlurmGpuLost", f"{n}:9817"): [Episode.of({"instance": f"{n}:9817"}, SINCE)]
              for n in SLURM_NODES}
    texts = [rem.handle(alert(instance=f"{n}:9817") | {"fingerprint": n},
                        firing) for n in SLURM_NODES]
    assert [t.outcome for t in texts] == ["drained", "drained", "refused", "refused"]
    assert texts[2].reason == "drain_cap" and "--max-drains" in texts[2].text
    assert [node for node, _ in drains] == ["gpu07", "gpu08"]
    rem.clock = lambda: 1000.0 + 3600
    assert rem.handle(alert(instance="gpu09:9817") | {"fingerprint": "gpu09"},
                      firing).outcome == "drained"


def test_the_reason_is_made_from_what_prometheus_shows_not_from_the_post() -> None:
    rem, drains = remediator()
    handle(rem, alert(uuid='GPU-1" Reason=x\n$(reboot)', gpu="7"))
    reason = drains[0][1]
    assert "gpu 3 GPU-x" in reason
    assert '"' not in reason and "\n" not in reason and "$" not in reason
    assert slurm_value("a\x1b[2Jb") == "a__2Jb"


def test_the_confirming_query_names_only_the_allowed_alerts() -> None:
    assert firing_query(["SlurmGpuLost", "SlurmGpuEccUncorrected"]) == (
        'ALERTS_FOR_STATE{alertname=~"SlurmGpuEccUncorrected|SlurmGpuLost"} and '
        'ignoring(alertstate) '
        'ALERTS{alertstate="firing",alertname=~"SlurmGpuEccUncorrected|SlurmGpuLost"}')


def test_dry_run_drains_nothing() -> None:
    rem, drains = remediator()
    rem.dry_run = True
    assert handle(rem, alert()) == "dry run: would drain gpu07"
    assert drains == []


def test_state_file_is_written_whole_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "enforce.json"
    state = EnforceState(path)
    state.add_warning("12", 100.0)
    state.add_warning("12", 200.0)
    state.add_warning("13", 300.0)
    assert EnforceState(path).warnings() == {"12": [100.0, 200.0], "13": [300.0]}
    state.keep_only({"13"})
    assert json.loads(path.read_text()) == {"jobs": {"13": {"warnings": [300.0]}}}
    assert [p.name for p in path.parent.iterdir()] == ["enforce.json"]  # no temp file left


def test_broken_state_file_stops_the_run(tmp_path: Path) -> None:
    path = tmp_path / "enforce.json"
    path.write_text("{not json")
    with pytest.raises(ReportError) as err:
        EnforceState(path)
    assert "enforce state" in str(err.value)


def test_cancel_without_a_notify_channel_is_refused_before_any_query(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("")
    code = main(["enforce", "--policy", str(policy), "--cancel",
                 "--prometheus-url", "http://127.0.0.1:9"])
    assert code == 2
    assert "--notify" in capsys.readouterr().err


def test_remediate_on_an_address_others_reach_without_client_auth_refuses_to_start(
        capsys: pytest.CaptureFixture[str]) -> None:
    for address in ("0.0.0.0:0", ":0", "[::]:0"):
        code = main(["remediate", "--web.listen-address", address,
                     "--prometheus-url", "http://127.0.0.1:9"])
        assert code == 2, address
        assert "refusing to listen" in capsys.readouterr().err


def test_tls_without_client_auth_is_no_authentication(caplog: pytest.LogCaptureFixture
                                                      ) -> None:
    """Issue 33: served with TLS but no basic auth and no client certificates, remediate
    said nothing, though anyone could post."""
    tls_only = WebConfig(tls=TlsSettings(Path("c.pem"), Path("k.pem")))
    with pytest.raises(ReportError, match=r"refusing to listen on 10\.0\.0\.5:9818"):
        check_exposure(["10.0.0.5:9818"], tls_only, insecure=False)
    check_exposure(["127.0.0.1:9818", "localhost:9819"], tls_only, insecure=False)
    check_exposure(["10.0.0.5:9818"], tls_only, insecure=True)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2 and all("without client authentication" in w for w in warnings)
    certs = WebConfig(tls=TlsSettings(Path("c.pem"), Path("k.pem"),
                                      client_auth_type="RequireAndVerifyClientCert"))
    check_exposure(["10.0.0.5:9818"], certs, insecure=False)
    check_exposure(["10.0.0.5:9818"], WebConfig(users={"am": b"$2b$..."}), insecure=False)


def _post(app: web.Application, payload: dict) -> tuple[int, list[str], str]:
    """POST /alerts, then GET /metrics, through aiohttp's test server (loopback)."""
    async def run() -> tuple[int, list[str], str]:
        async with TestClient(TestServer(app)) as client:
            resp = await client.post("/alerts", json=payload)
            results = (await resp.json())["results"]
            metrics = await (await client.get("/metrics")).text()
            return resp.status, results, metrics

    return asyncio.run(run())


def test_the_webhook_asks_prometheus_once_per_post_and_counts_each_outcome() -> None:
    rem, drains = remediator()
    asked: list[int] = []

    async def confirm() -> Firing:
        asked.append(1)
        return FIRING

    forged = alert(instance="gpu-node-17:9817") | {"fingerprint": "forged"}
    status, results, metrics = _post(make_app(rem, confirm),
                                     {"alerts": [alert(), forged, alert(instance="ALL")]})
    assert status == 200 and len(asked) == 1
    assert results == ["drained gpu07", "refused: Prometheus shows no firing SlurmGpuLost "
                       "for instance=gpu-node-17:9817", "refused: not a node name"]
    assert [node for node, _ in drains] == ["gpu07"]
    for outcome, reason in (("drained", "drained"), ("refused", "unconfirmed"),
                            ("refused", "not_a_node")):
        assert (f'slurm_gpu_remediate_alerts_total{{outcome="{outcome}",reason="{reason}"}} '
                "1.0") in metrics
    assert "slurm_gpu_remediate_drains_in_window 1.0" in metrics


def test_a_post_prometheus_cannot_confirm_drains_nothing_and_gets_503() -> None:
    rem, drains = remediator()

    async def unreachable() -> Firing:
        raise ReportError("cannot reach Prometheus at http://127.0.0.1:9", 3)

    status, results, metrics = _post(make_app(rem, unreachable), {"alerts": [alert()]})
    assert status == 503 and drains == []
    assert results == ["refused: cannot confirm the alert: Prometheus did not answer"]
    assert 'reason="prometheus_unavailable"} 1.0' in metrics


def test_the_webhooks_connection_guard_names_remediate() -> None:
    from slurm_gpu_exporter.web.middleware import GUARD_KEY

    rem, _ = remediator()

    async def confirm() -> Firing:
        return FIRING

    assert make_app(rem, confirm)[GUARD_KEY].product == "slurm-gpu-report remediate"
