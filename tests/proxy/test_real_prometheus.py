"""slurm-gpu-proxy in front of a real Prometheus scraping an agent on a simulated node
whose jobs belong to several users: the dashboards' queries as a user and as an admin,
and an attacker's list, end to end."""

from __future__ import annotations

import http.client
import json
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import promql_parser as pp
import pytest
import yaml

from tests.proxy.stack import (
    CLUSTER,
    PUBLIC,
    SECRET_HEADER,
    USER_HEADER,
    Client,
    ProxyStack,
    basic,
    password,
    request,
    start,
)
from tests.support import free_port, require, wait_until
from tests.support.daemons import DEPLOY, Daemon
from tests.system.observe import grafana

pytestmark = [pytest.mark.process, pytest.mark.prometheus]

DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
# Families whose every series carries `user`: a user's query over them alone must give
# exactly what Prometheus gives for that user.
PER_USER = ("slurm_job_", "jobid_user:", "user:")


@pytest.fixture(scope="module")
def proxy_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyStack]:
    running = start(tmp_path_factory.mktemp("proxy"))
    try:
        # The answers are compared at a time a few seconds back (see `at`): wait until
        # the recorded series the dashboards read have values there.
        for expr in ('user:slurm_job_gpu_busy:ratio_rate5m{user="alice"}',
                     "cluster:slurm_job_gpu_allocated_seconds:rate5m",
                     "jobid_user:slurm_job_gpus_held_idle:count_rate5m"):
            wait_until(lambda e=expr: running.prometheus.query(
                e, at=at())["data"]["result"], 60, expr, log=running.prometheus.log)
        yield running
    finally:
        running.stop()


def at() -> float:
    """An evaluation time in the past, so samples still arriving cannot change answers
    between the direct and the proxied query."""
    return time.time() - 3


def normal(answer: dict) -> list:
    assert answer["status"] == "success", answer
    data = answer["data"]
    if isinstance(data, dict) and "result" in data:
        result = data["result"]
        if data["resultType"] in ("scalar", "string"):
            return [result]
        return sorted((sorted(s["metric"].items()), s.get("value"), s.get("values"))
                      for s in result)
    return sorted(data, key=repr)


def jobids(proxy_stack: ProxyStack, user: str) -> list[str]:
    return sorted({s["metric"]["jobid"] for s in proxy_stack.prometheus.vector(
        f'slurm_job_info{{user="{user}"}}')})


def selector_names(expr: str) -> set[str]:
    names: set[str] = set()

    def visit(node: pp.Expr) -> None:
        if isinstance(node, pp.VectorSelector):
            names.add(node.name or "")

    pp.walk(pp.parse(expr), pre_visit=visit)
    return names


def run_board(client: Client, board: dict, values: dict[str, str], end: float) -> dict:
    """Every target's answer (training panels left out: the simulated node has none)."""
    out = {}
    for target in grafana.targets(board):
        if not grafana.relayed(target.expr):
            out[target.where()] = (target, normal({"status": "success", "data": {
                "resultType": "matrix", "result": grafana.run(client, target, values,
                                                              end - 120, end)}}))
    return out


def user_labels(result: list) -> set[str]:
    return {dict(labels).get("user", "") for labels, *_ in result} - {""}


# -- the dashboards --------------------------------------------------------------------


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_queries_as_a_user_show_only_their_own_jobs(proxy_stack: ProxyStack,
                                                              path: Path) -> None:
    board = grafana.load(path)
    alice = proxy_stack.as_user("alice")
    queries = grafana.variable_queries(board)
    assert grafana.resolve_variable(alice, queries["cluster"], {}) == [CLUSTER]
    base = {"cluster": CLUSTER}
    end = at()
    if "user" in queries:  # the user variable offers alice alone: preset, in effect
        assert grafana.resolve_variable(alice, queries["user"], base) == ["alice"]
    if "jobid" in queries:
        offered = grafana.resolve_variable(alice, queries["jobid"], base)
        assert offered and set(offered) <= set(jobids(proxy_stack, "alice")), offered
    own = {"user": {"user": "alice"}, "jobid": {"jobid": jobids(proxy_stack, "alice")[0]},
           "node": {"node": f"{proxy_stack.agent.url.removeprefix('http://')}"}}
    foreign = {"user": {"user": "bob"}, "jobid": {"jobid": jobids(proxy_stack, "bob")[0]}}
    nobody = {"user": {"user": "nobody"}, "jobid": {"jobid": "999999"}}
    swept = next((name for name in ("user", "jobid", "node") if name in queries), None)
    mine = run_board(alice, board, {**base, **own.get(swept, {})}, end)
    assert any(result for _, result in mine.values()), "alice sees nothing at all"
    for where, (_, result) in mine.items():
        assert user_labels(result) <= {"alice"}, (where, result)
    if swept in ("user", "jobid"):
        # A dashboard of alice's own: the families that carry `user`, and the public
        # ones, answer exactly as Prometheus does.
        direct = run_board(proxy_stack.direct, board, {**base, **own[swept]}, end)
        for where, (target, result) in mine.items():
            names = selector_names(grafana.fill(target.expr, {**base, **own[swept]}, 120))
            if all(n.startswith(PER_USER) or n in PUBLIC for n in names):
                assert result == direct[where][1], where
        # Someone else's job or user page: alice learns no more than from one that
        # does not exist.
        theirs = run_board(alice, board, {**base, **foreign[swept]}, end)
        none = run_board(alice, board, {**base, **nobody[swept]}, end)
        assert theirs == none


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_queries_as_an_admin_answer_as_prometheus_does(proxy_stack: ProxyStack,
                                                                 path: Path) -> None:
    board = grafana.load(path)
    values = {"cluster": CLUSTER, "user": "bob", "jobid": jobids(proxy_stack, "bob")[0],
              "node": proxy_stack.agent.url.removeprefix("http://")}
    end = at()
    admin = run_board(proxy_stack.as_user("root"), board, values, end)
    assert admin == run_board(proxy_stack.direct, board, values, end)
    assert any(result for _, result in admin.values())


# -- an attacker's list ---------------------------------------------------------------

# (alice's attack, the honest query for alice's own data it must answer like)
ATTACKS = [
    ('slurm_job_gpus{user=~".+"}', 'slurm_job_gpus{user="alice"}'),
    ('slurm_job_gpus{user!="alice"}', "vector(1) unless vector(1)"),
    ('slurm_job_gpus{user=~"bob|carol"}', "vector(1) unless vector(1)"),
    ('slurm_job_gpus{user="alice"} or slurm_job_gpus{user="bob"}',
     'slurm_job_gpus{user="alice"}'),
    ("slurm_job_gpus unless slurm_job_gpus{user=\"alice\"}", "vector(1) unless vector(1)"),
    ('slurm_job_gpus{user="alice"} + on() group_left sum(slurm_job_gpus)',
     'slurm_job_gpus{user="alice"} + on() group_left sum(slurm_job_gpus{user="alice"})'),
    ('label_replace(slurm_job_gpus, "user", "alice", "", "")',
     'slurm_job_gpus{user="alice"}'),
    ('label_join(slurm_job_gpus, "user", ",", "jobid")',
     'label_join(slurm_job_gpus{user="alice"}, "user", ",", "jobid")'),
    ("max_over_time(slurm_job_gpus[1m:1s])", 'max_over_time(slurm_job_gpus{user="alice"}[1m:1s])'),
    ("slurm_job_gpus offset 10s", 'slurm_job_gpus{user="alice"} offset 10s'),
    ("count(slurm_job_info @ end())", 'count(slurm_job_info{user="alice"})'),
    ('count({__name__=~".+"})', 'count({__name__=~".+", user="alice"})'),
    ("count by (user) (slurm_job_info)", 'count by (user) (slurm_job_info{user="alice"})'),
    ("topk(scalar(count(slurm_job_info)), slurm_job_gpus)",
     'topk(scalar(count(slurm_job_info{user="alice"})), slurm_job_gpus{user="alice"})'),
    ('slurm_job_gpus{jobid="1\\"} or {__name__=~\\".+"}', "vector(1) unless vector(1)"),
    ("sum(cluster:slurm_gpus:count)", "sum(cluster:slurm_gpus:count)"),
    ("count(slurm_gpu_power_watts)", "count(vector(1) unless vector(1))"),
]


@pytest.mark.parametrize(("attack", "honest"), ATTACKS, ids=[a for a, _ in ATTACKS])
def test_an_attack_answers_like_a_query_of_the_attackers_own_data(
        proxy_stack: ProxyStack, attack: str, honest: str) -> None:
    when = at()
    got = proxy_stack.as_user("alice").query(attack, at=when)
    assert normal(got) == normal(proxy_stack.prometheus.query(honest, at=when)), (attack, got)


def test_absent_tells_no_more_about_another_user_than_about_nobody(
        proxy_stack: ProxyStack) -> None:
    when, alice = at(), proxy_stack.as_user("alice")
    bob = alice.query('absent(slurm_job_info{user="bob"})', at=when)
    nobody = alice.query('absent(slurm_job_info{user="nobody"})', at=when)
    assert normal(bob) == normal(nobody) and bob["data"]["result"][0]["value"][1] == "1"


def test_a_long_query_is_restricted_too(proxy_stack: ProxyStack) -> None:
    # Past 4 KiB encoded, the restricted query goes upstream as a POST form.
    others = "|".join(str(n) for n in range(1000, 2200))
    long = f'count by (user) (slurm_job_info{{jobid!~"{others}"}})'
    assert len(long) > 4096
    answer = proxy_stack.as_user("alice").query(long)
    assert {s["metric"]["user"] for s in answer["data"]["result"]} == {"alice"}


def test_a_coordinator_sees_the_users_of_their_accounts(proxy_stack: ProxyStack) -> None:
    answer = proxy_stack.as_user("carol").query("count by (user) (slurm_job_info)")
    assert {s["metric"]["user"] for s in answer["data"]["result"]} == {"carol", "dave"}


def test_series_and_label_endpoints_are_restricted(proxy_stack: ProxyStack) -> None:
    alice = proxy_stack.as_user("alice")
    series = alice.get("/api/v1/series", [("match[]", "slurm_job_info"),
                                          ("match[]", '{__name__=~".+"}')])
    assert series.status == 200 and series.body["data"]
    assert {s.get("user") for s in series.body["data"]} == {"alice"}
    assert alice.label_values("user") == ["alice"]
    assert alice.label_values("user", '{__name__=~".+"}') == ["alice"]
    assert alice.label_values("jobid") == jobids(proxy_stack, "alice")
    names = set(alice.label_values("__name__"))
    assert set(PUBLIC) <= names and "slurm_gpu_power_watts" not in names
    labels = alice.post("/api/v1/labels", [("match[]", "slurm_job_info")])
    assert labels.status == 200 and "user" in labels.body["data"]
    # The encoded label name is decoded before it is checked, and restricted the same.
    assert request(f"{proxy_stack.proxy.url}/api/v1/label/us%65r/values",
                   basic("alice")).body["data"] == ["alice"]
    for endpoint in ("/api/v1/metadata", "/api/v1/status/buildinfo"):
        assert alice.get(endpoint).status == 200, endpoint
    exemplars = alice.post("/api/v1/query_exemplars", [("query", "slurm_job_info")])
    assert exemplars.status == 200 and exemplars.body["status"] == "success"


def test_repeated_and_mixed_parameters_are_refused(proxy_stack: ProxyStack) -> None:
    url = f"{proxy_stack.proxy.url}/api/v1/query"
    own, theirs = 'slurm_job_info{user="alice"}', "slurm_job_info"
    twice = urllib.parse.urlencode([("query", own), ("query", theirs)])
    assert request(f"{url}?{twice}", basic("alice")).status == 400
    mixed = request(f"{url}?{urllib.parse.urlencode({'query': own})}", basic("alice"),
                    urllib.parse.urlencode({"query": theirs}).encode())
    assert mixed.status == 400 and "given 2 times" in mixed.body["error"]
    multipart = request(url, basic("alice"), b"--x\r\n", content_type="multipart/form-data")
    assert multipart.status == 400


def test_encoded_paths_reach_only_what_their_decoded_path_allows(proxy_stack: ProxyStack) -> None:
    answer = request(f"{proxy_stack.proxy.url}/api/v1/%71uery?query=slurm_job_info", basic("alice"))
    assert {s["metric"]["user"] for s in answer.body["data"]["result"]} == {"alice"}
    conn = http.client.HTTPConnection("127.0.0.1", proxy_stack.proxy.port, timeout=10)
    try:
        for raw in ("/api/v1/query/../admin/tsdb/delete_series", "/api/v1//query",
                    "/api/v1/query%2f..%2f..%2ffederate",
                    "/api/v1/label/..%2f..%2ffederate/values"):
            conn.request("POST", raw, headers=basic("alice"))
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 403, raw
    finally:
        conn.close()


@pytest.mark.parametrize(("method", "path"), [
    ("GET", '/federate?match[]={__name__=~".%2B"}'),
    ("POST", '/api/v1/admin/tsdb/delete_series?match[]={__name__=~".%2B"}'),
    ("GET", "/api/v1/targets"), ("GET", "/api/v1/rules"), ("POST", "/api/v1/write"),
    ("POST", "/api/v1/read"),
    ("GET", "/graph"),
])
def test_other_endpoints_are_for_admins_only(proxy_stack: ProxyStack, method: str,
                                             path: str) -> None:
    answer = request(proxy_stack.proxy.url + path, basic("alice"),
                     b"" if method == "POST" else None, method=method)
    assert answer.status == 403 and answer.body["errorType"] == "endpoint"


def test_an_admin_reaches_federate(proxy_stack: ProxyStack) -> None:
    answer = request(proxy_stack.proxy.url + '/federate?match[]={job="slurm-gpu-exporter"}',
                     basic("root"))
    assert answer.status == 200 and 'user="bob"' in answer.text


def test_a_query_that_does_not_parse_gets_400_from_the_proxy(proxy_stack: ProxyStack) -> None:
    answer = proxy_stack.as_user("alice").post("/api/v1/query", [("query", "sum(slurm_job_gpus")])
    assert answer.status == 400 and answer.body["errorType"] == "bad_query"
    assert "does not parse" in answer.body["error"]


# -- who is asking --------------------------------------------------------------------


@pytest.mark.parametrize(("headers", "reason"), [
    ({}, "unauthenticated"),
    (basic("alice", "wrong"), "bad_credentials"),
    (basic("mallory"), "bad_credentials"),
    ({USER_HEADER: "bob"}, "forged_user_header"),
    ({**basic("alice"), USER_HEADER: "bob"}, "forged_user_header"),
    ({USER_HEADER: "bob", SECRET_HEADER: "not-the-secret-at-all"}, "forged_user_header"),
])
def test_no_wrong_or_forged_credentials_get_401(proxy_stack: ProxyStack, headers: dict[str, str],
                                                reason: str) -> None:
    answer = request(f"{proxy_stack.proxy.url}/api/v1/query?query=slurm_job_info", headers)
    assert answer.status == 401 and answer.body["errorType"] == reason


def test_grafana_proven_by_its_secret_names_the_user(proxy_stack: ProxyStack) -> None:
    answer = proxy_stack.via_grafana("bob").query("slurm_job_info")
    assert {s["metric"]["user"] for s in answer["data"]["result"]} == {"bob"}


def test_refusals_are_counted_and_logged_with_user_and_reason(proxy_stack: ProxyStack) -> None:
    request(f"{proxy_stack.proxy.url}/federate", basic("bob"))
    request(f"{proxy_stack.proxy.url}/api/v1/query?query=up", basic("carol", "guess"))
    assert request(f"{proxy_stack.proxy.url}/api/v1/query?query=up", basic("bob")).status == 200
    for line in ("refused GET '/federate' for user 'bob': endpoint",
                 "refused GET '/api/v1/query' for user 'carol': bad_credentials"):
        wait_until(lambda line=line: line in proxy_stack.proxy.log(), 10,
                   f"the log line {line!r}", log=proxy_stack.proxy.log)
    own = request(f"{proxy_stack.proxy.url}/metrics", basic("bob"))
    assert own.status == 200
    assert 'slurm_gpu_proxy_refusals_total{reason="endpoint"}' in own.text
    assert 'slurm_gpu_proxy_upstream_duration_seconds_count{endpoint="query"}' in own.text
    assert request(f"{proxy_stack.proxy.url}/metrics").status == 401
    assert request(f"{proxy_stack.proxy.url}/-/ready").status == 200


# -- TLS, and Grafana proven by its client certificate ---------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(d: Path) -> Path:
    """A CA, the proxy's server certificate and two client certificates (EC keys)."""
    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *key, "-days", "2", "-subj", "/CN=test-ca", "-keyout", "ca.key",
             "-out", "ca.crt", cwd=d)
    for name, san in (("server", "IP:127.0.0.1"), ("grafana", "DNS:grafana.example"),
                      ("other", "DNS:other.example")):
        _openssl("req", *key, "-subj", f"/CN={name}", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                 "-out", f"{name}.crt", cwd=d)
    return d


@pytest.fixture(scope="module")
def tls_proxy(proxy_stack: ProxyStack, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[tuple[Daemon, Path]]:
    require(shutil.which("openssl") is not None, "openssl (Debian package openssl) is missing")
    d = make_pki(tmp_path_factory.mktemp("pki"))
    hashed = bcrypt.hashpw(password("alice").encode(), bcrypt.gensalt(4)).decode()
    (d / "web.yml").write_text(yaml.safe_dump({
        "tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                              "client_auth_type": "VerifyClientCertIfGiven",
                              "client_ca_file": "ca.crt"},
        "basic_auth_users": {"alice": hashed}}))
    (d / "proxy.yml").write_text(yaml.safe_dump({"user_header": {
        "name": USER_HEADER, "client_cert_sans": ["grafana.example"]}}))
    port = free_port()
    proxy = Daemon("tls-proxy", [
        str(Path(sys.executable).parent / "slurm-gpu-proxy"),
        "--prometheus-url", proxy_stack.prometheus.url,
        "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(d / "web.yml"),
        "--config", str(d / "proxy.yml")], port, d)
    try:
        wait_until(lambda: _tls_status(proxy, d, None, "/-/ready", {}) == 200, 20,
                   "the proxy to be ready over TLS", log=proxy.log)
        yield proxy, d
    finally:
        proxy.stop()


def _tls_status(proxy: Daemon, pki: Path, cert: str | None, path: str,
                headers: dict[str, str]) -> int | str:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        ctx.load_cert_chain(pki / f"{cert}.crt", pki / f"{cert}.key")
    req = urllib.request.Request(f"https://127.0.0.1:{proxy.port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return resp.read().decode() if path.startswith("/api") else resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError):
        return 0


def test_over_tls_a_client_certificate_proves_grafana_and_passwords_still_work(
        tls_proxy: tuple[Daemon, Path]) -> None:
    proxy, pki = tls_proxy
    path = "/api/v1/query?query=count+by+(user)+(slurm_job_info)"

    def users(answer: int | str) -> set[str]:
        assert isinstance(answer, str), answer
        return {s["metric"]["user"] for s in json.loads(answer)["data"]["result"]}

    assert users(_tls_status(proxy, pki, "grafana", path, {USER_HEADER: "bob"})) == {"bob"}
    assert users(_tls_status(proxy, pki, None, path, basic("alice"))) == {"alice"}
    # The header from a client without the right certificate is forged.
    assert _tls_status(proxy, pki, None, path, {USER_HEADER: "bob"}) == 401
    assert _tls_status(proxy, pki, "other", path, {USER_HEADER: "bob"}) == 401
    assert _tls_status(proxy, pki, "other", path, basic("alice", "wrong")) == 401


# -- slurm-gpu-report through the proxy -----------------------------------------------


def _report(proxy_stack: ProxyStack, tmp_path: Path, user: str,
            *args: str) -> subprocess.CompletedProcess:
    secret = tmp_path / f"{user}.password"
    secret.write_text(password(user) + "\n")
    return subprocess.run(
        [str(Path(sys.executable).parent / "slurm-gpu-report"), *args, "--format", "json",
         "--prometheus-url", proxy_stack.proxy.url, "--username", user,
         "--password-file", str(secret)], capture_output=True, text=True, timeout=60,
        check=False)


def _users(value: object) -> set[str]:
    if isinstance(value, dict):
        own = {value["user"]} if isinstance(value.get("user"), str) else set()
        return own.union(*(_users(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_users(v) for v in value))
    return set()


def test_the_report_through_the_proxy_shows_a_user_their_jobs_alone(
        proxy_stack: ProxyStack, tmp_path: Path) -> None:
    # alice's one job is busy, so it is not low-util; carol's is idle.
    alice = _report(proxy_stack, tmp_path, "alice", "low-util", "--since", "2m")
    assert alice.returncode == 0 and _users(json.loads(alice.stdout)) <= {"alice"}
    carol = _report(proxy_stack, tmp_path, "carol", "low-util", "--since", "2m")
    assert carol.returncode == 0, carol.stderr
    seen = _users(json.loads(carol.stdout))
    assert "carol" in seen and seen <= {"carol", "dave"}
    own = _report(proxy_stack, tmp_path, "alice", "job", jobids(proxy_stack, "alice")[0])
    assert own.returncode == 0 and _users(json.loads(own.stdout)) == {"alice"}
    theirs = _report(proxy_stack, tmp_path, "alice", "job", jobids(proxy_stack, "bob")[0])
    assert theirs.returncode != 0 and "no metrics for job" in theirs.stderr
