"""The agent's output, checked by Prometheus' own tools and scraped by a real Prometheus."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import free_port, require, wait_until
from tests.support.agent import Agent, series

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def simulated_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    log = tmp_path_factory.mktemp("agent") / "agent.log"
    agent = Agent(["--simulate", "--sample-interval", "1"], log_path=log)
    try:
        agent.wait_ready()
        first = _last_sample(agent)
        wait_until(lambda: _last_sample(agent) > first, 10,
                   "a second sample, so counters have moved", log=agent.log)
        yield agent
    finally:
        agent.stop()


def _last_sample(agent: Agent) -> float:
    [(_, when)] = series(agent.metrics(), "slurm_gpu_exporter_last_sample_timestamp_seconds")
    return when


def test_promtool_check_metrics_passes_on_agent_output(simulated_agent: Agent) -> None:
    promtool = shutil.which("promtool")
    require(promtool is not None, "promtool (Debian package prometheus) is not installed")
    text = simulated_agent.metrics()
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                            text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == ""


def test_every_job_series_carries_jobid_and_user(simulated_agent: Agent) -> None:
    text = simulated_agent.metrics()
    names = [line.split("{")[0] for line in text.splitlines()
             if line.startswith("slurm_job_")]
    assert names
    for name in set(names):
        for labels, _ in series(text, name):
            assert labels.get("jobid") and labels.get("user"), (name, labels)


def test_openmetrics_and_gzip_are_served_when_asked(simulated_agent: Agent) -> None:
    status, headers, body = simulated_agent.get(headers={
        "Accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
        "Accept-Encoding": "gzip"})
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert headers["Content-Encoding"] == "gzip"
    text = gzip.decompress(body).decode()
    assert text.endswith("# EOF\n")
    assert "slurm_job_cpu_seconds_total{" in text
    status, headers, body = simulated_agent.get()
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b"# EOF" not in body


def test_health_and_readiness_endpoints_answer(simulated_agent: Agent) -> None:
    assert simulated_agent.get("/-/healthy")[0] == 200
    assert simulated_agent.get("/-/ready")[0] == 200
    assert simulated_agent.get("/nope")[0] == 404


def test_a_real_prometheus_scrapes_jobs_with_their_labels(simulated_agent: Agent,
                                                          tmp_path: Path) -> None:
    prometheus = shutil.which("prometheus")
    require(prometheus is not None, "prometheus (Debian package prometheus) is not installed")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: slurm-gpu\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{simulated_agent.port}']}}]\n"
    )
    proc = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("wb"),
    )
    try:
        result = _wait_for_query(port, "slurm_job_info", timeout=30)
        assert result, (tmp_path / "prometheus.log").read_text()[-2000:]
        for item in result:
            assert item["metric"]["jobid"] and item["metric"]["user"]
        up = _wait_for_query(port, 'up{job="slurm-gpu"} == 1', timeout=10)
        assert up
    finally:
        proc.terminate()
        proc.wait(15)


def _wait_for_query(port: int, query: str, timeout: float) -> list[dict]:  # type: ignore[type-arg]
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})

    def result() -> list[dict] | None:  # type: ignore[type-arg]
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                data = json.load(resp)
        except OSError:
            return None
        return data["data"]["result"] if data["status"] == "success" else None

    return wait_until(result, timeout, f"Prometheus to answer {query}", poll=0.5)


def _sample_errors(text: str, source: str) -> float:
    errors = series(text, "slurm_gpu_exporter_sample_errors_total")
    return {labels["source"]: value for labels, value in errors}.get(source, 0.0)


def test_an_unwritable_state_dir_is_counted_while_the_agent_keeps_serving(
        tmp_path: Path) -> None:
    from slurm_gpu_exporter.sim.synthnode import SynthNode

    node = SynthNode(tmp_path / "node")
    node.add_job(4101, [5001])
    blocker = tmp_path / "file"
    blocker.write_text("")  # the state dir would have to be made under a file: fails as root
    args = node.agent_args(1.0)
    args[args.index("--state-dir") + 1] = str(blocker / "state")
    agent = Agent(args, log_path=tmp_path / "agent.log")
    try:
        agent.wait_ready()
        text = agent.wait_metrics(lambda t: _sample_errors(t, "state") >= 2, 20,
                                  "two state dir errors counted")
        assert ({"source": "state"}, 0.0) in series(text, "slurm_gpu_exporter_source_up")
        assert any(labels["jobid"] == "4101" for labels, _ in series(text, "slurm_job_info"))
        assert agent.get("/-/healthy")[0] == 200
        assert "cannot save state" in agent.log()
    finally:
        agent.stop()
