"""The Grafana dashboards: stable identity, and every query answered by a real Prometheus."""

from __future__ import annotations

import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from tests.support.daemons import DEPLOY
from tests.system.observe import grafana
from tests.system.observe.conftest import Stack

pytestmark = pytest.mark.prometheus

DASHBOARDS = DEPLOY / "grafana" / "dashboards"
GENERATOR = DEPLOY / "grafana" / "generate_dashboards.py"
EXPECTED = {"slurm-gpu-job.json": "slurm-gpu-job", "slurm-gpu-user.json": "slurm-gpu-user",
            "slurm-gpu-cluster.json": "slurm-gpu-cluster",
            "slurm-gpu-node.json": "slurm-gpu-node"}
# Series that exist only once a GPU went wrong while a job held it: their panels are
# empty on a healthy node (the query must still run).
EMPTY_WHEN_HEALTHY = ("slurm_job_gpu_xid_", "ecc_errors", "remapped_rows", "pcie_replays",
                      "nvlink_errors")
THROTTLED = "slurm_job_gpu_throttled_seconds_total"
# What each dashboard's variables are filled with: every value the variable offers.
SWEPT = {"slurm-gpu-job": "jobid", "slurm-gpu-user": "user", "slurm-gpu-node": "node"}
# The simulated agent's Slurm node (the stack scrapes it as 127.0.0.1:PORT).
SIM_NODE = "simnode"


def test_dashboards_have_stable_uids_and_one_datasource_variable() -> None:
    assert sorted(p.name for p in DASHBOARDS.glob("*.json")) == sorted(EXPECTED)
    for name, uid in EXPECTED.items():
        board = grafana.load(DASHBOARDS / name)
        assert board["uid"] == uid
        assert board["__inputs"][0]["name"] == "DS_PROMETHEUS"
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert "cluster" in variables
        for panel in board["panels"]:
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}", panel["title"]
                assert 'cluster=~"$cluster"' in target["expr"] or "cluster" not in target[
                    "expr"], (name, panel["title"])


def test_committed_dashboards_are_what_the_generator_writes(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(GENERATOR), "--output", str(tmp_path)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(EXPECTED)
    for path in tmp_path.iterdir():
        assert (DASHBOARDS / path.name).read_text() == path.read_text(), (
            f"{path.name} is out of date: run python3 {GENERATOR.relative_to(DEPLOY.parent)}")


def test_job_links_point_at_the_job_dashboard_uid() -> None:
    for name in ("slurm-gpu-user.json", "slurm-gpu-cluster.json", "slurm-gpu-node.json"):
        text = (DASHBOARDS / name).read_text()
        assert "/d/slurm-gpu-job/" in text, name


def dependent_variables(stack: Stack, board: dict, values: dict[str, str]) -> dict[str, str]:
    """The variables that follow from the swept one, as Grafana fills them: the job's
    nodes (checked: Slurm's name; then All), the picked node's targets (All of them)."""
    queries = grafana.variable_queries(board)
    regexes = grafana.variable_regexes(board)
    out = {}
    if board["uid"] == "slurm-gpu-job":
        nodes = grafana.resolve_variable(stack.node, queries["node"], values, regexes["node"])
        assert nodes == [SIM_NODE], f"job {values['jobid']}: node variable offers {nodes}"
        out["node"] = ".*"
    if board["uid"] == "slurm-gpu-node":
        targets = grafana.resolve_variable(stack.node, queries["instance"], values)
        assert targets == [f"127.0.0.1:{stack.agent.port}"], targets
        out["instance"] = grafana.multi_value(targets)
    return out


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_dashboard_query_returns_data(stack: Stack, name: str) -> None:
    board = grafana.load(DASHBOARDS / name)
    stack.node.wait_for("jobid_user:slurm_job_gpus_held_idle:count_rate5m")
    # A few seconds of data after the rules started, so rates have two points.
    time.sleep(max(0.0, stack.started + 8 - time.time()))
    end = time.time()
    start = max(stack.started - 5, end - 600)
    queries = grafana.variable_queries(board)
    values = {}
    clusters = grafana.resolve_variable(stack.node, queries["cluster"], {})
    assert clusters == [stack.cluster], f"{name}: cluster variable offers {clusters}"
    values["cluster"] = clusters[0]
    swept = SWEPT.get(board["uid"])
    choices = [None]
    if swept:
        choices = grafana.resolve_variable(stack.node, queries[swept], values)
        assert choices, f"{name}: variable {swept} offers nothing"
    if swept == "node":  # Slurm's names, not the address the stack scrapes
        assert choices == [SIM_NODE], f"{name}: node variable offers {choices}"
    failures = []
    capped: dict[str | None, bool] = {}  # job -> a GPU of it power-capped on the panel
    for choice in choices:
        filled = {**values, **({swept: choice} if swept else {})}
        filled.update(dependent_variables(stack, board, filled))
        for target in grafana.targets(board):
            if grafana.relayed(target.expr):
                continue  # the simulated node runs no training script: tests/training_relay
            result = grafana.run(stack.node, target, filled, start, end)
            # Series shown now (a range's first seconds, before the rules first recorded
            # the node map, show the target: what a range before an upgrade shows).
            named = [grafana.legend(target.legend, s["metric"]) for s in result
                     if "slurm_node" in target.legend
                     and ("value" in s or float(s["values"][-1][0]) >= end - 2)]
            if any(SIM_NODE not in n or "127.0.0.1" in n for n in named):
                failures.append(f"{target.where()}: legends {named} do not name the node")
            if THROTTLED in target.expr and target.instant:  # the sim power-caps busy GPUs
                capped[choice] = capped.get(choice, False) or any(
                    s["metric"].get("reason") == "power" and float(s["value"][1]) > 0
                    for s in result)
            if result or any(series in target.expr for series in EMPTY_WHEN_HEALTHY):
                continue
            if "sm_active" in target.expr and swept == "jobid" and not stack.node.query_range(
                    f'slurm_job_gpu_sm_active_seconds_total{{jobid="{choice}"}}', start,
                    end)["data"]["result"]:
                # SM activity (GPM) exists only where the job has a GPU to itself: the
                # simulated node's stray process may share this job's GPU.
                warnings.warn(f"{target.where()}: not checked, job {choice} has no SM "
                              "activity series", stacklevel=1)
                continue
            failures.append(f"{target.where()} with {filled}: no data\n  {target.expr}")
    assert not failures, "\n".join(failures)
    if board["uid"] == "slurm-gpu-job":  # the SM activity queries were checked somewhere
        assert stack.node.query_range("slurm_job_gpu_sm_active_seconds_total", start,
                                      end)["data"]["result"]
        # and the throttle panel showed a job the simulated node really power-caps
        assert any(capped.values()), f"no job power-capped on the throttle panel: {capped}"
