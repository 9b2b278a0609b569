"""The throttling and error-counter facts of ``scripts/gpu-check --probe`` (gpu_probe.py).

What the agent's throttle and error bookkeeping (gpu/nvml/health.py, gpu/attribution/throttle.py,
gpu/attribution/job_errors.py) assumes, read from the driver itself. Where real drivers are known
or suspected to differ from the fake NVML (tests/fakenvml), the probe records it:

- ``nvmlViolationTime_t.referenceTime`` is documented as a CPU timestamp in µs, but on
  which clock (realtime, boottime) and whether it moves between reads is not said: the
  probe records its offset from each host clock and how far it moved against the host's
  elapsed time (``reference_per_host_s``: 1e6 if it is µs that tick).
- ``violationTime`` is documented in ns, cumulative since the driver loaded; the probe
  records how much it grew per host second (0..1e9 where ns), never negative.
- Policies unsupported per board: GeForce and some PCIe boards answer NOT_SUPPORTED for
  sync boost, board limit or reliability; NVML 13 marks nvmlDeviceGetViolationStatus
  deprecated in favour of field values (NVML_FI_DEV_PERF_POLICY_*), so a future driver
  may refuse it (FUNCTION_NOT_FOUND) on every policy.
- ``nvmlDeviceGetCurrentClocksEventReasons`` exists from driver 535; older drivers know
  only ...ClocksThrottleReasons. The probe records both and the supported mask.
- MIG instances: violation counters, clocks and error counters are per physical GPU; a
  MIG device handle is expected to answer NOT_SUPPORTED (recorded under ``mig``).
- Remapped rows exist on A100/H100 (not on V100: NOT_SUPPORTED); NVLink counters only
  on links that are up; PCIe replays on every board but some vGPUs. The agent reads the
  NVLink totals as field values (``nvlink_total_fields``) where the driver has them.

Only nvidia-ml-py is needed.
"""

from __future__ import annotations

import time
from typing import Any

POLICIES = {"power": 0, "thermal": 1, "sync_boost": 2, "board_limit": 3,
            "low_utilization": 4, "reliability": 5, "app_clocks": 10, "base_clocks": 11}
NVLINK_COUNTERS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}


def _call(fn: Any, *args: Any) -> Any:
    """fn's result, or {"error": NVML_ERROR_*} (a missing symbol as FUNCTION_NOT_FOUND)."""
    import pynvml

    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        names = [n for n in dir(pynvml)
                 if n.startswith("NVML_ERROR_") and getattr(pynvml, n) == exc.value]
        return {"error": names[0] if names else str(exc)}


def _violations(handle: Any) -> tuple[float, dict[str, Any]]:
    import pynvml

    at = time.clock_gettime(time.CLOCK_REALTIME)
    out = {}
    for name, policy in POLICIES.items():
        got = _call(pynvml.nvmlDeviceGetViolationStatus, handle, policy)
        out[name] = got if isinstance(got, dict) else {
            "reference": int(got.referenceTime), "violation_ns": int(got.violationTime)}
    return at, out


def probe_violations(handle: Any, seconds: float) -> dict[str, Any]:
    """Each policy's counter read twice ``seconds`` apart: return codes, units, growth."""
    t0, first = _violations(handle)
    boot0 = time.clock_gettime(time.CLOCK_BOOTTIME)
    time.sleep(seconds)
    t1, second = _violations(handle)
    out: dict[str, Any] = {}
    for name, a in first.items():
        b = second[name]
        if "error" in a or "error" in b:
            out[name] = a if "error" in a else b
            continue
        host = t1 - t0
        out[name] = {
            "violation_ns": b["violation_ns"],
            "grew_ns_per_host_s": round((b["violation_ns"] - a["violation_ns"]) / host, 1),
            "went_back": b["violation_ns"] < a["violation_ns"],
            "reference_per_host_s": round((b["reference"] - a["reference"]) / host, 1),
            "reference_behind_s": {"realtime": round(t0 - a["reference"] / 1e6, 3),
                                   "boottime": round(boot0 - a["reference"] / 1e6, 3)},
        }
    return out


def probe_counters(handle: Any) -> dict[str, Any]:
    """Clocks-event reasons (both names, the supported mask), SM clocks, remapped rows,
    PCIe replays, NVLink states and error counters."""
    import pynvml

    out: dict[str, Any] = {}
    for key, name in (("reasons", "nvmlDeviceGetCurrentClocksEventReasons"),
                      ("reasons_old_name", "nvmlDeviceGetCurrentClocksThrottleReasons"),
                      ("reasons_supported", "nvmlDeviceGetSupportedClocksEventReasons")):
        fn = getattr(pynvml, name, None)
        out[key] = _call(fn, handle) if fn is not None else {"error": "not in nvidia-ml-py"}
    out["sm_clock_mhz"] = _call(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)
    out["sm_clock_max_mhz"] = _call(pynvml.nvmlDeviceGetMaxClockInfo, handle,
                                    pynvml.NVML_CLOCK_SM)
    rows = _call(pynvml.nvmlDeviceGetRemappedRows, handle)
    out["remapped_rows"] = rows if isinstance(rows, dict) else dict(
        zip(("correctable", "uncorrectable", "pending", "failure"), rows, strict=False))
    out["pcie_replays"] = _call(pynvml.nvmlDeviceGetPcieReplayCounter, handle)
    links: dict[str, Any] = {}
    for link in range(18):
        state = _call(pynvml.nvmlDeviceGetNvLinkState, handle, link)
        if isinstance(state, dict):
            links[str(link)] = state
            if state["error"] in ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT"):
                break
            continue
        links[str(link)] = {"active": bool(state)} | ({
            kind: _call(pynvml.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter)
            for kind, counter in NVLINK_COUNTERS.items()} if state else {})
    out["nvlink"] = links
    totals = _call(pynvml.nvmlDeviceGetFieldValues, handle, [52, 59, 38, 45])
    out["nvlink_total_fields"] = totals if isinstance(totals, dict) else {
        kind: (int(v.value.ullVal) if v.nvmlReturn == pynvml.NVML_SUCCESS
               else {"error": int(v.nvmlReturn)})
        for kind, v in zip(NVLINK_COUNTERS, totals, strict=True)}
    return out


def probe_call_cost(handle: Any, links: dict[str, Any], n: int = 50) -> dict[str, Any]:
    """Wall µs per call of each read the agent makes every sample (the agent makes 8
    violation calls and 4 per active NVLink per GPU): what these reads cost a node."""
    import pynvml

    calls: dict[str, tuple[Any, ...]] = {
        "violation": (pynvml.nvmlDeviceGetViolationStatus, handle, POLICIES["power"]),
        "clocks_event_reasons": (pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle),
        "sm_clock": (pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
        "remapped_rows": (pynvml.nvmlDeviceGetRemappedRows, handle),
        "pcie_replays": (pynvml.nvmlDeviceGetPcieReplayCounter, handle),
    }
    active = [int(k) for k, v in links.items() if v.get("active")]
    if active:
        calls["nvlink_error_counter"] = (pynvml.nvmlDeviceGetNvLinkErrorCounter, handle,
                                         active[0], NVLINK_COUNTERS["crc_flit"])
    out: dict[str, Any] = {}
    for name, (fn, *args) in calls.items():
        t0 = time.perf_counter()
        for _ in range(n):
            got = _call(fn, *args)
        out[name] = (round((time.perf_counter() - t0) / n * 1e6, 1)
                     if not isinstance(got, dict) else got)
    out["active_nvlinks"] = len(active)
    return out


def probe_mig(handle: Any) -> dict[str, Any] | None:
    """On a MIG-enabled GPU: what its first MIG device answers (None: MIG off)."""
    import pynvml

    mode = _call(pynvml.nvmlDeviceGetMigMode, handle)
    if isinstance(mode, dict) or mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
        return None
    for i in range(7):
        mig = _call(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
        if not isinstance(mig, dict):
            got = _call(pynvml.nvmlDeviceGetViolationStatus, mig, POLICIES["power"])
            return {"violation_power": got if isinstance(got, dict) else "NVML_SUCCESS",
                    "pcie_replays": _call(pynvml.nvmlDeviceGetPcieReplayCounter, mig)}
    return {"instances": 0}


def probe_health(handle: Any, seconds: float) -> dict[str, Any]:
    """Everything above for one GPU."""
    counters = probe_counters(handle)
    return {"violations": probe_violations(handle, seconds), **counters,
            "call_us": probe_call_cost(handle, counters["nvlink"]), "mig": probe_mig(handle)}
