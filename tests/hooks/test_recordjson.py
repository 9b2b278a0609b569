"""The spool's JSON without the json package gives json's bytes and json's answers.

The prolog writes records through ``_json`` (json's C half) to skip importing ``re``;
a record must still be byte for byte what ``json.dumps(..., sort_keys=True)`` wrote,
and any input must decode, or fail, as ``json.loads`` does.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_gpu_exporter.hooks import recordjson, spool
from slurm_gpu_exporter.model import ids

_SCALARS = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
            | st.text())


def _json_loads(raw: bytes) -> tuple[str, object]:
    try:
        return "value", json.loads(raw)
    except Exception as exc:
        return type(exc).__name__, str(exc)


def _ours(raw: bytes) -> tuple[str, object]:
    try:
        return "value", recordjson.loads_object(raw)
    except Exception as exc:
        return type(exc).__name__, str(exc)


def _same(a: object, b: object) -> bool:
    """Equal, with NaN equal to NaN (json.loads('NaN') gives one)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def test_a_record_is_written_as_json_dumps_writes_it() -> None:
    record = spool.JobRecord(jobid="42", uid=1001, user="ålice \"x\"\n\x00\u2028",
                             job_gpus="0,1", start_time=1764623456.123456, end_time=None)
    data = {"version": spool.SCHEMA_VERSION, **{n: getattr(record, n) for n in spool._FIELDS}}
    assert record.to_json() == (json.dumps(data, sort_keys=True) + "\n").encode()


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(), _SCALARS, max_size=20))
def test_any_flat_object_is_encoded_as_json_dumps_encodes_it(data: dict[str, object]) -> None:
    assert recordjson.dumps_object(data) == (json.dumps(data, sort_keys=True) + "\n").encode()


def test_values_a_record_never_holds_go_to_json_itself() -> None:
    data: dict[str, object] = {"b": [1, {"x": None}], "a": 1.0}
    assert recordjson.dumps_object(data) == (json.dumps(data, sort_keys=True) + "\n").encode()


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(), _SCALARS | st.lists(_SCALARS, max_size=3), max_size=20))
def test_what_json_wrote_is_read_as_json_reads_it(data: dict[str, object]) -> None:
    raw = (json.dumps(data, sort_keys=True) + "\n").encode()
    kind, value = _ours(raw)
    assert kind == "value" and _same(value, json.loads(raw))


@pytest.mark.parametrize("raw", [
    b'{"a": 1} x', b'{"a": 1}{}', b'{"a": 1', b'{"a": NaN}', b'{"a": -Infinity}',
    b'{"a": "\xed\xa0\x80"}', b'{"a": "\xff"}', b'\xef\xbb\xbf{"a": 1}',
    '{"a": 1}'.encode("utf-16-le"), '{"a": 1}'.encode("utf-16"), b'  {"a": 1}  \r\n\t',
    b'{"a": "\x01"}', b'{"a": 01}', b'{"a": 1, "a": 2}', b'[1, 2]', b'"x"', b"", b"{",
    b'{"', b'{"a": 1e400}', b'{"a": 12345678901234567890123}', b'{"\\ud800": "\\udfff"}',
])
def test_odd_bytes_decode_or_fail_as_json_loads_does(raw: bytes) -> None:
    assert _same(_ours(raw), _json_loads(raw))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64).map(lambda b: b'{"' + b))
def test_any_bytes_decode_or_fail_as_json_loads_does(raw: bytes) -> None:
    assert _same(_ours(raw), _json_loads(raw))


@pytest.mark.parametrize("text", ["", "0", "00", "01", "1", "9", "10", "4294967295",
                                  "9999999999", "10000000000", "12345678901", "+1", "-1",
                                  " 1", "1 ", "1\n", "\u0661", "\u00b2", "1.0", "1e3"])
def test_id_checks_match_slurms_id_patterns(text: str) -> None:
    import re

    assert ids.is_slurm_id(text) == bool(re.fullmatch(ids.SLURM_ID, text))
    assert ids.is_slurm_num(text) == bool(re.fullmatch(ids.SLURM_NUM, text))


@pytest.mark.parametrize("text", ["sEKNKTV3WPV500", "s0000000000000", "sZZZZZZZZZZZZZ",
                                  "SEKNKTV3WPV500", "sekNKTV3WPV500", "sEKNKTV3WPV50",
                                  "sEKNKTV3WPV5000", "sEKNKTV3WPVI00", "sEKNKTV3WPVU00",
                                  "sEKNKTV3WPV50\n", "s\uff10" * 1, "", "s"])
def test_sluid_check_matches_the_sluid_pattern(text: str) -> None:
    import re

    assert ids.is_sluid(text) == bool(re.fullmatch(ids.SLUID, text))
