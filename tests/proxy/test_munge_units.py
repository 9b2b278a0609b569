"""The pure parts of the munge identity: what a credential must look like before
munged is asked, reading unmunge's answer (its exit status first, then the uid and the
payload, which must name this proxy), the user-name check, and a proxy without
--munge."""

from __future__ import annotations

import asyncio

import pytest

from slurm_gpu_exporter.model.munge_wire import CREDENTIAL
from slurm_gpu_exporter.proxy import cli as proxy_cli
from slurm_gpu_exporter.proxy import munge as munge_module
from slurm_gpu_exporter.proxy.cli import munge_audiences
from slurm_gpu_exporter.proxy.identity import Caller, Refusal, _munge_caller
from slurm_gpu_exporter.proxy.munge import (
    MungeDecoder,
    MungeRefusal,
    MungeUser,
    _refusal,
    _uid,
    audience_refusal,
    read_answer,
)


def test_credential_shape_is_munges_text_form() -> None:
    assert CREDENTIAL.fullmatch("MUNGE:AwQFAAB+abc/9==:")
    for bad in ("MUNGE:", "MUNGE:abc", "munge:abc:", "MUNGE:ab c:", "MUNGE:abc:\nX",
                "MUNGE:a\"b:"):
        assert not CREDENTIAL.fullmatch(bad), bad


def test_uid_is_read_from_unmunges_numeric_metadata() -> None:
    assert _uid(b"UID:             1001\n") == 1001
    assert _uid(b"UID: root\n") is None
    assert _uid(b"UID: 1\nUID: 2\n") is None


def test_munges_error_codes_name_the_refusal() -> None:
    assert _refusal(15).reason == "munge_expired"
    assert _refusal(17).reason == "munge_replayed"
    assert (_refusal(11).status, _refusal(11).reason) == (401, "munge_invalid")
    assert _refusal(6).status == 503  # munged down: not the caller's fault


def test_munge_credential_without_munge_flag_is_refused() -> None:
    who = asyncio.run(_munge_caller("MUNGE:abc:", None))
    assert isinstance(who, Refusal) and (who.status, who.reason) == (401, "munge_off")


PROXY = "https://metrics.example.org:9818"
MINE = f"slurm-gpu-proxy {PROXY}".encode()


def _answer(code: int, payload: bytes = MINE) -> int | MungeRefusal:
    # What unmunge --numeric --keys=UID prints: the metadata, a blank line, the payload.
    return read_answer(code, b"UID:             1001\n\n" + payload, {PROXY})


def test_unmunges_exit_status_is_honoured_whatever_it_printed() -> None:
    assert _answer(0) == 1001  # the truth: the same output with status 0 is taken
    for code, reason in [(15, "munge_expired"), (17, "munge_replayed"),
                         (18, "munge_unauthorized"), (11, "munge_invalid"),
                         (1, "munge_invalid"), (-9, "munge_invalid")]:
        refusal = _answer(code)
        assert isinstance(refusal, MungeRefusal) and refusal.reason == reason, code


class FakeUnmunge:
    """The unmunge process as asyncio hands it back: its output and exit status."""

    def __init__(self, out: bytes, returncode: int) -> None:
        self.out, self.returncode = out, returncode

    async def communicate(self, data: bytes) -> tuple[bytes, bytes]:
        return self.out, b""


def test_the_decoder_takes_unmunges_exit_status(monkeypatch: pytest.MonkeyPatch) -> None:
    # The whole decode path, with the process replaced: an expired credential whose
    # metadata and payload unmunge printed anyway is refused.
    async def decode(returncode: int) -> object:
        async def spawn(*argv: str, **kwargs: object) -> FakeUnmunge:
            assert "--keys=UID" in argv
            return FakeUnmunge(b"UID: 1001\n\n" + MINE, returncode)

        monkeypatch.setattr(munge_module.asyncio, "create_subprocess_exec", spawn)
        decoder = MungeDecoder(unmunge="/bin/true", audiences={PROXY})
        return await decoder.decode("MUNGE:AwQFAAB+abc/9==:")

    expired = asyncio.run(decode(15))
    assert isinstance(expired, MungeRefusal) and expired.reason == "munge_expired"
    taken = asyncio.run(decode(0))
    assert isinstance(taken, MungeUser) and taken.uid == 1001


def test_a_credential_must_name_this_proxy() -> None:
    assert _answer(0, MINE + b"\n") == 1001  # as `echo ... | munge` makes it
    plain = _answer(0, b"")
    assert isinstance(plain, MungeRefusal) and plain.reason == "munge_no_audience"
    assert "upgrade slurm-gpu-report" in plain.message
    for payload in (b"slurm-gpu-proxy https://other.example.org:9818",
                    b"slurm-gpu-proxy " + PROXY.encode() + b"/prefix",
                    b"slurm-gpu-proxy  " + PROXY.encode(), b"slurm-gpu-proxy",
                    PROXY.encode(), b"SLURM-GPU-PROXY " + PROXY.encode(),
                    b"slurmrestd job 1234", MINE + b"\x00", MINE + b" GET /api/v1/query"):
        refusal = _answer(0, payload)
        assert isinstance(refusal, MungeRefusal), payload
        assert (refusal.status, refusal.reason) == (401, "munge_wrong_audience"), payload
        assert PROXY in refusal.message  # says which URL the proxy takes


def test_a_wrong_audience_is_shown_only_when_it_is_a_plain_url() -> None:
    shown = audience_refusal(b"slurm-gpu-proxy http://other:9818", {PROXY})
    assert shown is not None and "'http://other:9818'" in shown.message
    for hostile in (b"slurm-gpu-proxy http://x/\x1b[31m", b"slurm-gpu-proxy <script>",
                    b"slurm-gpu-proxy http://" + b"a" * 300, b"\xff\xfe"):
        refusal = audience_refusal(hostile, {PROXY})
        assert refusal is not None and "another service" in refusal.message, hostile
        assert "\x1b" not in refusal.message and "script" not in refusal.message


class FixedDecoder:
    """Stands for MungeDecoder: whatever munged said."""

    def __init__(self, answer: MungeUser | MungeRefusal) -> None:
        self.answer = answer

    async def decode(self, credential: str) -> MungeUser | MungeRefusal:
        return self.answer


def _caller(answer: MungeUser | MungeRefusal) -> object:
    return asyncio.run(_munge_caller("MUNGE:abc:", FixedDecoder(answer)))  # type: ignore[arg-type]


def test_a_munge_identity_must_be_a_user_name() -> None:
    assert _caller(MungeUser(1001, "sgeuser")) == Caller("sgeuser", "munge")
    for name in ("bad name", "-x", "a\nb", "alice\x1b[0m", "é", ""):
        who = _caller(MungeUser(1001, name))
        assert isinstance(who, Refusal) and (who.status, who.reason) == (
            401, "bad_credentials"), name
    refusal = _caller(MungeRefusal(401, "munge_replayed", "used"))
    assert isinstance(refusal, Refusal) and refusal.reason == "munge_replayed"


def test_the_proxy_takes_the_audiences_given_or_its_own_names(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert munge_audiences(["HTTPS://Metrics.example.org:9818/", "https://gw/prom/"],
                           [":9818"], tls=True) == {"https://metrics.example.org:9818",
                                                    "https://gw/prom"}
    monkeypatch.setattr(proxy_cli.socket, "gethostname", lambda: "head1")
    monkeypatch.setattr(proxy_cli.socket, "getfqdn", lambda: "head1.example.org")
    assert munge_audiences([], [":9818", "127.0.0.1:9819", "[::1]:9820"], tls=False) == {
        "http://head1:9818", "http://head1.example.org:9818", "http://127.0.0.1:9819",
        "http://[::1]:9820"}
    assert munge_audiences([], ["0.0.0.0:443"], tls=True) == {
        "https://head1", "https://head1.example.org"}
    with pytest.raises(ValueError, match=r"--munge\.audience: 'ftp://x'"):
        munge_audiences(["ftp://x"], [":9818"], tls=False)
