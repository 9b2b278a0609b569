"""slurm-gpu-proxy --munge on the real munged of the test cluster: a good credential is
its owner's identity with that user's limits; forged, expired, replayed and another
key's credentials are 401, and so is one made for another service (issue 42: any
`munge -n` credential was taken, so one handed to another service could be replayed
here within its TTL) or restricted to another uid."""

from __future__ import annotations

import asyncio
import os
import pwd
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu_exporter.model.munge_wire import payload
from slurm_gpu_exporter.proxy.munge import MungeDecoder, MungeRefusal
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.prometheus.client import Connection, PrometheusClient
from slurm_gpu_exporter.report.slurm.munge import munge_credential
from tests.proxy.stack import Answer, request, simulated_rig, write_configs
from tests.support import free_port, wait_until
from tests.support.daemons import Daemon
from tests.support.munge import SITE_SOCKET, OwnMunged, credential, for_proxy
from tests.support.slurmcluster import SlurmCluster

pytestmark = [pytest.mark.process, pytest.mark.prometheus, pytest.mark.slurm]

USER, OTHER = "sgeuser", "sgeuser2"  # the test cluster's users (not admins)
JOBS_BY_USER = "count by (user) (slurm_job_info)"


class Stack:
    def __init__(self, base: Path) -> None:
        web, proxy_config, _ = write_configs(base)
        self.rig = simulated_rig(base)
        port = free_port()
        self.proxy = Daemon("proxy", [
            str(Path(sys.executable).parent / "slurm-gpu-proxy"),
            "--prometheus-url", self.rig.prom.url,
            "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(web),
            "--config", str(proxy_config), "--admin", "root",
            "--munge", f"--munge.socket={SITE_SOCKET}"], port, base)

    def ask(self, cred: str, expr: str = JOBS_BY_USER) -> Answer:
        return request(f"{self.proxy.url}/api/v1/query?query={expr.replace(' ', '%20')}",
                       {"Authorization": f"Munge {cred}"})

    def mine(self, user: str, **options: object) -> str:
        """A credential of ``user`` made for this proxy."""
        return for_proxy(user, self.proxy.url, **options)

    def stop(self) -> None:
        self.proxy.stop()
        self.rig.stop()


@pytest.fixture(scope="module")
def stack(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Stack]:
    running = Stack(tmp_path_factory.mktemp("munge-proxy"))
    try:
        running.proxy.wait_ready()
        prometheus = running.rig.prom
        wait_until(lambda: prometheus.query(JOBS_BY_USER)["data"]["result"], 60,
                   "the simulated jobs in Prometheus", log=prometheus.log)
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
    everyone = users_seen(stack.ask(stack.mine("root")))  # root is an admin
    assert {"alice", "bob"} <= everyone
    assert users_seen(stack.ask(stack.mine(USER))) == set()  # sgeuser has no jobs there
    values = request(f"{stack.proxy.url}/api/v1/label/user/values",
                     {"Authorization": f"Munge {stack.mine(USER)}"})
    assert values.status == 200 and values.body["data"] == [], values.text


def test_forged_bytes_are_refused(stack: Stack) -> None:
    good = stack.mine(USER)
    middle = len(good) // 2
    forged = good[:middle] + ("A" if good[middle] != "A" else "B") + good[middle + 1:]
    refused(stack.ask(forged), "munge_invalid")
    refused(stack.ask("MUNGE:not-base64!:"), "munge_malformed")
    refused(stack.ask("MUNGE:" + "A" * 5000 + ":"), "munge_malformed")


def test_another_users_expired_credential_is_refused(stack: Stack) -> None:
    old = stack.mine(OTHER, ttl=1)
    time.sleep(2.5)  # the credential's TTL running out, which is what is tested
    refused(stack.ask(old), "munge_expired")


def test_replayed_credential_is_refused(stack: Stack) -> None:
    once = stack.mine(USER)
    assert stack.ask(once).status == 200
    refused(stack.ask(once), "munge_replayed")


def test_credential_of_another_key_is_refused(stack: Stack) -> None:
    other_site = OwnMunged()
    try:
        foreign = credential("root", socket=other_site.socket,
                             payload=f"slurm-gpu-proxy {stack.proxy.url}")
    finally:
        other_site.stop()
    refused(stack.ask(foreign), "munge_invalid")


def test_a_credential_made_for_another_service_is_refused(stack: Stack) -> None:
    # What another munge service takes: a plain `munge -n` (an older client made these).
    plain = stack.ask(credential(USER))
    refused(plain, "munge_no_audience")
    assert "upgrade slurm-gpu-report" in plain.body["error"]
    # Made for another proxy, or with another service's payload.
    elsewhere = stack.ask(for_proxy(USER, "http://127.0.0.2:9818"))
    refused(elsewhere, "munge_wrong_audience")
    assert "'http://127.0.0.2:9818'" in elsewhere.body["error"]
    assert stack.proxy.url in elsewhere.body["error"]  # what the proxy takes
    refused(stack.ask(credential(USER, payload="job 1234 for slurmrestd")),
            "munge_wrong_audience")
    refused(stack.ask(credential(USER, payload=f"slurm-gpu-proxy {stack.proxy.url}/x")),
            "munge_wrong_audience")


def _real_client_sees(stack: Stack, restrict_uid: int | None = None) -> set[str]:
    """The users whose jobs root sees through the report's own client: a credential per
    request from slurm/munge.py, sent as client.py sends it (root is an admin)."""
    url = stack.proxy.url + "/"  # a trailing slash names the same proxy
    conn = Connection(url=url, munge_credential=lambda: munge_credential(
        payload(url), str(SITE_SOCKET), restrict_uid=restrict_uid))

    async def ask() -> set[str]:
        async with PrometheusClient(conn) as prom:
            return {s.labels["user"] for s in await prom.instant(JOBS_BY_USER, time.time())}

    return asyncio.run(ask())


def test_a_credential_from_the_real_client_signs_in(stack: Stack) -> None:
    assert {"alice", "bob"} <= _real_client_sees(stack)
    # Restricted to the proxy's uid (the tests': root), as munge_restrict_uid makes it.
    assert {"alice", "bob"} <= _real_client_sees(stack, restrict_uid=os.geteuid())


def test_a_credential_restricted_to_another_uid_is_refused(stack: Stack) -> None:
    # Made for this proxy, but decodable only by sgeuser2, not by the proxy's uid (the
    # tests' own: root, whom munged refuses such a credential too).
    other_uid = pwd.getpwnam(OTHER).pw_uid
    refused(stack.ask(stack.mine(USER, restrict_uid=other_uid)), "munge_unauthorized")
    with pytest.raises(ReportError, match=r"munge_unauthorized.*munge_restrict_uid"):
        _real_client_sees(stack, restrict_uid=other_uid)
    # The truth beside it: restricted to the proxy's own uid, it is taken.
    assert users_seen(stack.ask(stack.mine(USER, restrict_uid=os.geteuid()))) == set()


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
