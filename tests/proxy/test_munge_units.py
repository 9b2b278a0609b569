"""The pure parts of the munge identity: what a credential must look like before
munged is asked, reading unmunge's answer, and a proxy without --munge."""

from __future__ import annotations

import asyncio

from slurm_gpu_exporter.proxy.identity import Refusal, _munge_caller
from slurm_gpu_exporter.proxy.munge import CREDENTIAL, _refusal, _uid


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
