"""Who is asking, decided in process on mocked requests: basic-auth users of the web
config, a user header from a client that proves itself, a munge credential (a stand-in
decoder), and every refusal with its status, reason, message and the name claimed."""

from __future__ import annotations

import asyncio
import base64

from aiohttp.test_utils import make_mocked_request

from slurm_gpu_exporter.proxy.config import UserHeader
from slurm_gpu_exporter.proxy.identity import Caller, Refusal, identify
from slurm_gpu_exporter.proxy.munge import MungeRefusal, MungeUser
from slurm_gpu_exporter.web.basic_auth import BasicAuth
from slurm_gpu_exporter.web.config import WebConfig

# Passwords compared as they are: the check itself is web/basic_auth.py's.
USERS = WebConfig(users={"alice": b"alice-pw", "bad name": b"x"},
                  password_check=lambda given, hashed: given == hashed)
HEADER = UserHeader("X-Grafana-User", "X-Proxy-Secret", b"0123456789abcdef")
CREDENTIAL = "MUNGE:AwQFAAC" + "A" * 40 + ":"


class Decoder:
    """munged's answer for every credential, without munged."""

    def __init__(self, answer: MungeUser | MungeRefusal) -> None:
        self.answer = answer

    async def decode(self, credential: str) -> MungeUser | MungeRefusal:
        return self.answer


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def who(headers: dict[str, str], config: WebConfig = USERS, header: UserHeader | None = None,
        munge: object = None) -> Caller | Refusal:
    request = make_mocked_request("GET", "/api/v1/query", headers=headers)
    return asyncio.run(identify(request, config, header, munge,  # type: ignore[arg-type]
                                auth=BasicAuth()))


def test_a_basic_auth_user_with_the_right_password_is_that_user() -> None:
    assert who({"Authorization": basic("alice", "alice-pw")}) == Caller("alice", "basic")


def test_a_wrong_password_is_refused_naming_the_user_claimed() -> None:
    assert who({"Authorization": basic("alice", "nope")}) == Refusal(
        401, "bad_credentials", "wrong user name or password", "alice")


def test_a_verified_user_name_that_is_no_user_name_is_refused() -> None:
    assert who({"Authorization": basic("bad name", "x")}) == Refusal(
        401, "bad_credentials", "basic-auth user names must be letters, digits and ._@+-",
        "bad name")


def test_no_credentials_say_which_ways_in_there_are() -> None:
    assert who({}) == Refusal(401, "unauthenticated", "authentication required: basic auth "
                              "with a user of the web config")
    assert who({}, munge=Decoder(MungeUser(1000, "alice"))) == Refusal(
        401, "unauthenticated", "authentication required: basic auth with a user of the web "
        "config or 'Authorization: Munge <credential>' made for this proxy "
        "(slurm-gpu-report --auth munge)")
    assert who({}, config=WebConfig(), header=HEADER) == Refusal(
        401, "unauthenticated", "authentication required: the user header from a client "
        "that proves itself")


def test_a_user_header_with_the_shared_secret_names_the_caller() -> None:
    assert who({"X-Grafana-User": "bob", "X-Proxy-Secret": "0123456789abcdef"},
               header=HEADER) == Caller("bob", "header")


def test_a_user_header_without_the_secret_is_forged() -> None:
    for secret in ({}, {"X-Proxy-Secret": "wrong"}):
        assert who({"X-Grafana-User": "bob", **secret}, header=HEADER) == Refusal(
            401, "forged_user_header", "X-Grafana-User is accepted only from a client that "
            "proves itself (shared secret or client certificate)", "bob")


def test_a_user_header_must_hold_one_user_name() -> None:
    assert who({"X-Grafana-User": "bob smith", "X-Proxy-Secret": "0123456789abcdef"},
               header=HEADER) == Refusal(
        401, "bad_user_header", "X-Grafana-User must hold one user name (letters, digits, "
        "._@+-)", "bob smith")


def test_a_munge_credential_names_its_owner() -> None:
    assert who({"Authorization": "Munge " + CREDENTIAL},
               munge=Decoder(MungeUser(1000, "carol"))) == Caller("carol", "munge")


def test_a_munge_credential_without_munge_is_refused() -> None:
    assert who({"Authorization": "Munge " + CREDENTIAL}) == Refusal(
        401, "munge_off", "this proxy does not take munge credentials (start it with "
        "--munge); use basic auth")


def test_munges_refusal_and_odd_names_are_refusals() -> None:
    refusal = MungeRefusal(503, "munge_unavailable", "munged did not answer")
    assert who({"Authorization": "Munge " + CREDENTIAL}, munge=Decoder(refusal)) == Refusal(
        503, "munge_unavailable", "munged did not answer")
    assert who({"Authorization": "Munge " + CREDENTIAL},
               munge=Decoder(MungeUser(7, "a b"))) == Refusal(
        401, "bad_credentials", "user names must be letters, digits and ._@+-", "a b")
