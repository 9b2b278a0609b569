"""A job's detail as plain data (JSON-ready) and back: what slurm-gpu-proxy's archive
endpoint sends and ``job`` reads, so that a job from the archive through the proxy is
rendered from the very figures ``job --db`` renders.

Reading checks every field's type: the answer comes over the network, and a field of
the wrong type is refused whole (DetailDataError), never half-used.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from slurm_gpu_exporter.report.figures.gpu_events import GpuFault, Throttle
from slurm_gpu_exporter.report.figures.shapes import (
    Accounting,
    GpuDetail,
    JobDetail,
    JobUsage,
    NodeDetail,
)

# The dataclasses a detail is made of; only these are built from data.
_PARTS = (JobDetail, JobUsage, NodeDetail, GpuDetail, Accounting, Throttle, GpuFault)
MAX_NOTES = 100
MAX_NODES = 10_000


class DetailDataError(ValueError):
    """The data is not a job detail; the message says which field is wrong."""


# Fields added since the first release, left out of the data while they hold their
# default, so that a reader of an older release still takes the detail whole.
_LATER_USAGE_FIELDS = {"array_job_id": "", "array_task_id": "", "slowed_s": None,
                       "slowed_reason": "", "more": None}
_LATER_GPU_FIELDS = {"throttled": [], "faults": [], "more": None}
_LATER_NODE_FIELDS = {"more": None}
MAX_MORE = 100  # figures without a field of their own (figures/table.py), per part


def detail_to_data(detail: JobDetail) -> dict[str, Any]:
    """The detail's own fields (no derived figures), nested: JSON-serialisable."""
    data = dataclasses.asdict(detail)
    _drop_defaults(data["usage"], _LATER_USAGE_FIELDS)
    for node in data["nodes"]:
        _drop_defaults(node, _LATER_NODE_FIELDS)
        for gpu in node["gpus"]:
            _drop_defaults(gpu, _LATER_GPU_FIELDS)
    return data


def _drop_defaults(data: dict[str, Any], later: dict[str, Any]) -> None:
    for name, default in later.items():
        # an empty ``more`` is as good as none
        if name in data and (data[name] == default or (name == "more" and not data[name])):
            del data[name]


def detail_from_data(data: Any) -> JobDetail:
    """The detail ``detail_to_data`` made; DetailDataError when a field is missing,
    unknown or of the wrong type."""
    detail = _build(JobDetail, data, "job")
    if len(detail.nodes) > MAX_NODES or len(detail.notes) > MAX_NOTES:
        raise DetailDataError("job: more nodes or notes than a job has")
    return detail


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise DetailDataError(f"{where}: not an object")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise DetailDataError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    values = {}
    for name, field in fields.items():
        if name not in data:
            if (field.default is dataclasses.MISSING
                    and field.default_factory is dataclasses.MISSING):
                raise DetailDataError(f"{where}.{name}: missing")
            continue
        values[name] = _value(hints[name], data[name], f"{where}.{name}")
    return cls(**values)


def _value(hint: Any, value: Any, where: str) -> Any:
    """``value`` checked against the field's type ``hint``."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None:
        if type(None) in options:
            return None
        raise DetailDataError(f"{where}: must not be null")
    for option in options:
        if option is type(None):
            continue
        if typing.get_origin(option) is dict:
            if not isinstance(value, dict) or len(value) > MAX_MORE:
                raise DetailDataError(f"{where}: not an object of at most {MAX_MORE} figures")
            key_hint, item = typing.get_args(option)
            return {_value(key_hint, k, f"{where} key"): _value(item, v, f"{where}[{k!r}]")
                    for k, v in value.items()}
        if typing.get_origin(option) is list:
            if not isinstance(value, list):
                raise DetailDataError(f"{where}: not a list")
            (item,) = typing.get_args(option)
            return [_value(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        if option in _PARTS:
            return _build(option, value, where)
        if isinstance(value, bool):
            break  # JSON true/false is no number nor text here
        if option is float and isinstance(value, (int, float)):
            return float(value)
        if option in (int, str) and isinstance(value, option):
            return value
    raise DetailDataError(f"{where}: wrong type ({type(value).__name__})")
