"""slurm-gpu-report against a real Prometheus scraping two simulated nodes.

Both agents run ``--simulate`` with the same seed, so every job id appears on
two instances: a two-node job, which the report must show as one row. The
report's figures are checked against the agents' own counters, read from the
same snapshot Prometheus scraped (each agent serves one snapshot per
``--sample-interval``; ``slurm_gpu_exporter_last_sample_timestamp_seconds``
tells which).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import wait_until
from tests.support.agent import Agent, series
from tests.support.daemons import Prometheus
from tests.support.rig import Rig, Scrape

pytestmark = pytest.mark.prometheus

REPORT = str(Path(sys.executable).parent / "slurm-gpu-report")
SAMPLE_INTERVAL_S = 5
LAST_SAMPLE = "slurm_gpu_exporter_last_sample_timestamp_seconds"


@dataclass
class Node:
    agents: list[Agent]
    prometheus: Prometheus
    started: float


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """Two rigs, one simulated node each: the first without a Prometheus, the second's
    Prometheus scraping both agents as one job."""
    work = tmp_path_factory.mktemp("report-prom")
    started = time.time()
    with Rig(work / "node0", simulate=True, sample_interval=SAMPLE_INTERVAL_S,
             scrapes={}) as first:
        both = Scrape(configs=lambda address: [{"job_name": "slurm-gpu", "static_configs": [
            {"targets": [first.address, address]}]}])
        with Rig(work / "node1", simulate=True, sample_interval=SAMPLE_INTERVAL_S,
                 scrape=both) as second:
            second.prom.wait_for(
                "count(count by (instance) (slurm_job_gpu_busy_seconds_total)) == 2",
                timeout=30)
            # Long enough that the bursty job (3 s busy every 30 s) is under 15 % busy.
            time.sleep(max(0.0, started + 25 - time.time()))
            yield Node([first.agent, second.agent], second.prom, started)


def report(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([REPORT, *args, "--prometheus-url", node.prometheus.url],
                          capture_output=True, text=True, timeout=60, check=False)


def scraped_snapshot(node: Node) -> tuple[float, list[str]]:
    """A moment at which Prometheus' latest sample of each agent is the snapshot the
    agent serves now; returns it with the agents' expositions."""

    def caught_up() -> tuple[float, list[str]] | None:
        texts = [a.metrics() for a in node.agents]
        stamps = {series(t, LAST_SAMPLE)[0][1] for t in texts}
        at = time.time()
        got = {float(r["value"][1]) for r in node.prometheus.vector(LAST_SAMPLE, at)}
        # Both agents still serve what we read: nothing moved in between.
        if got == stamps and [a.metrics() for a in node.agents] == texts:
            return at, texts
        return None

    return wait_until(caught_up, 20 * SAMPLE_INTERVAL_S,
                      "Prometheus to catch up with the agents' snapshots", poll=0.2)


def agent_ratios(texts: list[str]) -> dict[str, tuple[float, float]]:
    """(busy, allocated) GPU-seconds per job, summed over both agents."""
    sums: dict[str, list[float]] = {}
    for text in texts:
        for name, i in (("slurm_job_gpu_busy_seconds_total", 0),
                        ("slurm_job_gpu_allocated_seconds_total", 1)):
            for labels, value in series(text, name):
                sums.setdefault(labels["jobid"], [0.0, 0.0])[i] += value
    return {j: (b, a) for j, (b, a) in sums.items()}


def busy_by_gpu(texts: list[str]) -> dict[tuple[int, str, str], float]:
    """Each GPU's busy seconds: (agent, jobid, gpu) -> value."""
    return {(i, labels["jobid"], labels["gpu"]): value for i, text in enumerate(texts)
            for labels, value in series(text, "slurm_job_gpu_busy_seconds_total")}


def idle_gpus(before: dict[tuple[int, str, str], float],
              after: dict[tuple[int, str, str], float]) -> dict[str, int]:
    """GPUs per job whose busy counter did not move (``before`` empty: stayed at 0)."""
    counts: dict[str, int] = {}
    for key, value in after.items():
        counts.setdefault(key[1], 0)
        counts[key[1]] += value == before.get(key, 0.0)
    return counts


def job_names(texts: list[str]) -> dict[str, str]:
    return {labels["jobid"]: labels["name"] for labels, _ in series(texts[0], "slurm_job_info")}


def test_low_util_flags_exactly_the_idle_and_low_jobs_with_the_agents_ratios(
        node: Node) -> None:
    end, texts = scraped_snapshot(node)
    window = ["--start", f"{node.started - 60:.3f}", "--end", f"{end:.3f}"]
    everything = report(node, "low-util", *window, "--threshold", "1", "--format", "json")
    assert everything.returncode == 0, everything.stderr
    rows = {r["job"]: r for r in json.loads(everything.stdout)["flagged"]}
    truth = agent_ratios(texts)
    assert set(rows) == set(truth)
    for jobid, (busy, allocated) in truth.items():
        assert rows[jobid]["busy_ratio"] == pytest.approx(busy / allocated, abs=0.005), jobid
        assert rows[jobid]["gpu_hours"] == pytest.approx(allocated / 3600, rel=1e-6)
        assert rows[jobid]["idle_gpus"] == idle_gpus({}, busy_by_gpu(texts))[jobid], jobid

    default = report(node, "low-util", *window, "--format", "json")
    assert default.returncode == 0, default.stderr
    data = json.loads(default.stdout)
    flagged = {r["job"] for r in data["flagged"]}
    names = job_names(texts)
    assert flagged == {j for j, n in names.items() if n in ("idle-train", "bursty-train")}
    assert flagged == {j for j, (b, a) in truth.items() if b / a < data["threshold"]}
    assert data["jobs_seen"] == len(truth)


def test_a_job_on_two_nodes_is_one_row_summed_over_both(node: Node) -> None:
    end, texts = scraped_snapshot(node)
    out = report(node, "low-util", "--since", "10m", "--end", f"{end:.3f}",
                 "--threshold", "1", "--format", "csv")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()[1:]
    jobids = [line.split(",")[0] for line in lines]
    assert len(jobids) == len(set(jobids)) == len(agent_ratios(texts))
    per_node = {labels["jobid"]: value for labels, value in series(texts[0], "slurm_job_gpus")}
    for line in lines:
        jobid, gpus = line.split(",")[0], int(line.split(",")[4])
        assert gpus == 2 * per_node[jobid]


def test_a_window_that_starts_after_the_jobs_counts_only_what_happened_in_it(
        node: Node) -> None:
    start, before = scraped_snapshot(node)
    time.sleep(SAMPLE_INTERVAL_S + 1)
    end, after = scraped_snapshot(node)
    out = report(node, "low-util", "--start", f"{start:.3f}", "--end", f"{end:.3f}",
                 "--threshold", "1", "--format", "json")
    assert out.returncode == 0, out.stderr
    rows = {r["job"]: r for r in json.loads(out.stdout)["flagged"]}
    first, last = agent_ratios(before), agent_ratios(after)
    for jobid, (busy, allocated) in last.items():
        busy_in, allocated_in = busy - first[jobid][0], allocated - first[jobid][1]
        assert rows[jobid]["gpu_hours"] == pytest.approx(allocated_in / 3600, rel=1e-6)
        assert rows[jobid]["busy_ratio"] == pytest.approx(busy_in / allocated_in, abs=0.005)
    idle = idle_gpus(busy_by_gpu(before), busy_by_gpu(after))
    assert {j: r["idle_gpus"] for j, r in rows.items()} == idle
    for jobid, name in job_names(after).items():
        if name == "idle-train":
            assert idle[jobid] == 2  # its GPU on each of the two nodes
        elif name == "busy-train":
            assert idle[jobid] == 0


def test_job_report_of_an_idle_job_says_the_gpu_was_never_used(node: Node) -> None:
    names = job_names([node.agents[0].metrics()])
    idle = next(j for j, n in names.items() if n == "idle-train")
    busy = next(j for j, n in names.items() if n == "busy-train")
    out = report(node, "job", idle, busy, "--no-sacct", "--format", "json")
    assert out.returncode == 0, out.stderr
    jobs = {j["job"]: j for j in json.loads(out.stdout)["jobs"]}
    assert any(n.startswith("GPU never used") for n in jobs[idle]["notes"])
    assert not any(n.startswith("GPU never used") for n in jobs[busy]["notes"])
    assert len(jobs[idle]["gpus_detail"]) == 2  # one GPU on each of the two nodes
    table = report(node, "job", idle, "--no-sacct")
    assert table.returncode == 0 and "GPU never used" in table.stdout


def test_job_report_shows_sm_activity_next_to_busy_where_the_gpus_have_gpm(node: Node) -> None:
    names = job_names([node.agents[0].metrics()])
    busy = next(j for j, n in names.items() if n == "busy-train")
    out = report(node, "job", busy, "--no-sacct", "--format", "json")
    assert out.returncode == 0, out.stderr
    [job] = json.loads(out.stdout)["jobs"]
    # The simulated H100s report SM activity at 0.7 of the busy share.
    assert job["sm_active_ratio"] == pytest.approx(0.7 * job["busy_ratio"], abs=0.03)
    for gpu in job["gpus_detail"]:
        assert gpu["sm_active_ratio"] == pytest.approx(0.7 * gpu["busy_ratio"], abs=0.03)
    table = report(node, "job", busy, "--no-sacct")
    assert table.returncode == 0 and "GPU SM active" in table.stdout


def test_the_number_of_queries_does_not_depend_on_the_number_of_jobs(node: Node) -> None:
    texts = [node.agents[0].metrics()]
    names = job_names(texts)
    one_user = next(iter(series(texts[0], "slurm_job_info")))[0]["user"]

    def queries(*args: str) -> tuple[int, int]:
        out = report(node, *args, "--format", "json")
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        return data["queries"], len(data.get("flagged", data.get("jobs", [])))

    few, n_few = queries("low-util", "--since", "5m", "--threshold", "1", "--user", one_user)
    many, n_many = queries("low-util", "--since", "5m", "--threshold", "1")
    assert n_few < n_many and few == many
    ids = list(names)
    assert queries("job", ids[0], "--no-sacct")[0] == queries("job", *ids, "--no-sacct")[0]


def test_html_report_charts_the_flagged_jobs_with_one_more_query(node: Node,
                                                                  tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    out = report(node, "low-util", "--since", "5m", "--format", "html", "-o", str(path), "-v")
    assert out.returncode == 0, out.stderr
    page = path.read_text()
    assert page.count('class="chart timeline"') >= 2
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "11 PromQL queries" in page  # the 10 of low-util, plus one range query


def test_unknown_job_is_one_line_and_a_non_zero_exit(node: Node) -> None:
    out = report(node, "job", "999999", "--no-sacct")
    assert out.returncode == 5
    assert out.stderr.count("\n") == 1 and "no metrics for job 999999" in out.stderr
    assert out.stdout == ""


def test_no_job_in_the_result_says_so_and_exits_0(node: Node) -> None:
    out = report(node, "low-util", "--since", "5m", "--user", "nobody")
    assert out.returncode == 0, out.stderr
    assert "No job under the threshold (0 GPU jobs in the window)" in out.stdout


def test_notify_dry_run_then_send_once_over_smtp(node: Node, tmp_path: Path,
                                                  smtp_inbox: tuple[str, list[bytes]]) -> None:
    target, inbox = smtp_inbox
    state = tmp_path / "notified.json"
    common = ["low-util", "--since", "5m", "--state-file", str(state), "--mail-to",
              "{user}@example.org"]
    dry = report(node, *common, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    would_send = dry.stdout.count("Subject: GPU jobs flagged")
    assert would_send >= 1 and "@example.org" in dry.stdout
    assert not state.exists() and not inbox
    sent = report(node, *common, "--notify", target)
    assert sent.returncode == 0, sent.stderr
    assert len(inbox) == would_send
    again = report(node, *common, "--notify", target)
    assert again.returncode == 0 and "Nothing to send" in again.stdout
    assert len(inbox) == would_send
    assert len(json.loads(state.read_text())) >= would_send
