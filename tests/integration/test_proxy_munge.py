"""slurm-gpu-proxy --munge on the real munged of the test cluster: a good credential is
its owner's identity with that user's limits; forged, expired, replayed and another
key's credentials are 401."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu_exporter.proxy.munge import MungeDecoder, MungeRefusal
from tests.agent import Agent
from tests.daemons import Daemon, Prometheus, tool
from tests.integration.slurmcluster import SlurmCluster
from tests.munge import SITE_SOCKET, OwnMunged, credential
from tests.proxy.stack import Answer, prometheus_config, request, write_configs
from tests.support import free_port, wait_until

pytestmark = [pytest.mark.process, pytest.mark.prometheus, pytest.mark.slurm]

USER, OTHER = "sgeuser", "sgeuser2"  # the test cluster's users (not admins)
JOBS_BY_USER = "count by (user) (slurm_job_info)"


class Stack:
    def __init__(self, base: Path) -> None:
        tool("prometheus", package="prometheus")
        web, proxy_config, _ = write_configs(base)
        self.agent = Agent(["--simulate", "--sample-interval", "1"],
                           log_path=base / "agent.log")
        self.prometheus = Prometheus("prometheus", prometheus_config(self.agent),
                                     base / "prometheus")
        port = free_port()
        self.proxy = Daemon("proxy", [
            str(Path(sys.executable).parent / "slurm-gpu-proxy"),
            "--prometheus-url", self.prometheus.url,
            "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(web),
            "--config", str(proxy_config), "--admin", "root",
            "--munge", f"--munge.socket={SITE_SOCKET}"], port, base)

    def ask(self, cred: str, expr: str = JOBS_BY_USER) -> Answer:
        return request(f"{self.proxy.url}/api/v1/query?query={expr.replace(' ', '%20')}",
                       {"Authorization": f"Munge {cred}"})

    def stop(self) -> None:
        for thing in (self.proxy, self.prometheus, self.agent):
            thing.stop()


@pytest.fixture(scope="module")
def stack(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Stack]:
    running = Stack(tmp_path_factory.mktemp("munge-proxy"))
    try:
        for thing in (running.agent, running.prometheus, running.proxy):
            thing.wait_ready()
        wait_until(lambda: running.prometheus.query(JOBS_BY_USER)["data"]["result"], 60,
                   "the simulated jobs in Prometheus", log=running.prometheus.log)
        yield running
    finally:
        running.stop()


def users_seen(answer: Answer) -> set[str]:
    assert answer.status == 200, answer.text
    return {series["metric"]["user"] for series in answer.body["data"]["result"]}


def refused(answer: Answer, reason: str) -> None:
    assert answer.status == 401, answer.text
    assert answer.body["errorType"] == reason, answer.body


def test_credential_is_its_owners_identity_with_their_limits(stack: Stack) -> None:
    everyone = users_seen(stack.ask(credential("root")))  # root is an admin
    assert {"alice", "bob"} <= everyone
    assert users_seen(stack.ask(credential(USER))) == set()  # sgeuser has no jobs there
    values = request(f"{stack.proxy.url}/api/v1/label/user/values",
                     {"Authorization": f"Munge {credential(USER)}"})
    assert values.status == 200 and values.body["data"] == [], values.text


def test_forged_bytes_are_refused(stack: Stack) -> None:
    good = credential(USER)
    middle = len(good) // 2
    forged = good[:middle] + ("A" if good[middle] != "A" else "B") + good[middle + 1:]
    refused(stack.ask(forged), "munge_invalid")
    refused(stack.ask("MUNGE:not-base64!:"), "munge_malformed")
    refused(stack.ask("MUNGE:" + "A" * 5000 + ":"), "munge_malformed")


def test_another_users_expired_credential_is_refused(stack: Stack) -> None:
    old = credential(OTHER, ttl=1)
    time.sleep(2.5)  # the credential's TTL running out, which is what is tested
    refused(stack.ask(old), "munge_expired")


def test_replayed_credential_is_refused(stack: Stack) -> None:
    once = credential(USER)
    assert stack.ask(once).status == 200
    refused(stack.ask(once), "munge_replayed")


def test_credential_of_another_key_is_refused(stack: Stack) -> None:
    other_site = OwnMunged()
    try:
        foreign = credential("root", socket=other_site.socket)
    finally:
        other_site.stop()
    refused(stack.ask(foreign), "munge_invalid")


def test_basic_auth_still_works_beside_munge(stack: Stack) -> None:
    assert request(f"{stack.proxy.url}/api/v1/query?query=up",
                   {"Authorization": "Basic YWxpY2U6YWxpY2UtcGFzc3dvcmQ="}).status == 200


def test_munged_that_does_not_answer_is_503_not_401(stack: Stack, tmp_path: Path) -> None:
    decoder = MungeDecoder(tmp_path / "no-such.socket")
    answer = asyncio.run(decoder.decode(credential(USER)))
    assert isinstance(answer, MungeRefusal) and answer.status == 503, answer


def test_no_credential_is_told_both_ways_in(stack: Stack) -> None:
    answer = request(f"{stack.proxy.url}/api/v1/query?query=up")
    assert answer.status == 401 and answer.body["errorType"] == "unauthenticated"
    assert "basic auth" in answer.body["error"] and "Munge" in answer.body["error"]
