"""NVML reads of what slows a GPU or breaks it: violation counters by reason (the current
clocks-event reasons where it has none), SM clocks, remapped rows, PCIe replays and
NVLink errors.

Every call goes through the FieldReader, so a call a GPU does not support (a policy
a consumer board lacks, NVLink on a PCIe card) is asked once and then never again:
most of these are a dozen calls per GPU, and cost matters (issue 49). The maximum SM
clock does not change while the driver runs: it is read once per GPU. NVLink errors
are read as totals over the links in one field-values call; where the driver has no
such fields, the links are found once per GPU (their state), then only the active ones
are read, link by link.
"""

from __future__ import annotations

import pynvml

from slurm_gpu_exporter.gpu.nvml.fields import Device, FieldReader
from slurm_gpu_exporter.gpu.readings import HealthReading

# gpu/attribution/throttle.REASONS in NVML's NVML_PERF_POLICY_* numbers (nvml.h).
POLICIES = {"power": 0, "thermal": 1, "sync_boost": 2, "board_limit": 3,
            "low_utilization": 4, "reliability": 5, "app_clocks": 10, "base_clocks": 11}
# NVML_NVLINK_ERROR_DL_*: the counters exported, by the `kind` label; and the
# NVML_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL fields that sum each over the links.
NVLINK_COUNTERS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}
NVLINK_TOTAL_FIELDS = {"replay": 52, "recovery": 59, "crc_flit": 38, "crc_data": 45}
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS before 13.x: links an H100/B200 has at most
_CLOCK_SM = 1  # NVML_CLOCK_SM


class HealthReader:
    """Reads one GPU's HealthReading; remembers what does not change (max clock, links)."""

    def __init__(self, fields: FieldReader) -> None:
        self.fields = fields
        self._max_clock: dict[str, int | None] = {}
        self._links: dict[str, tuple[int, ...]] = {}
        self._supported_reasons: dict[str, int | None] = {}

    def read(self, d: Device, errors: list[str]) -> HealthReading:
        f = self.fields
        violations = []
        for reason, policy in POLICIES.items():
            v = f.field(d.uuid, f"violation_{reason}", pynvml.nvmlDeviceGetViolationStatus,
                        errors, d.handle, policy)
            if v is not None:
                violations.append((reason, int(v.violationTime)))
        counters = self._counters(d, errors)
        reasons = supported = None
        if not violations and all((d.uuid, f"violation_{r}") in f.unsupported for r in POLICIES):
            # No violation counters (NVML 13 deprecates the call): the current reasons
            # are sampled instead (gpu/attribution/throttle.py), for the reasons the GPU reports.
            if d.uuid not in self._supported_reasons:
                self._supported_reasons[d.uuid] = f.field(
                    d.uuid, "clocks_event_reasons_supported",
                    pynvml.nvmlDeviceGetSupportedClocksEventReasons, errors, d.handle)
            supported = self._supported_reasons[d.uuid]
            reasons = f.field(d.uuid, "clocks_event_reasons",
                              pynvml.nvmlDeviceGetCurrentClocksEventReasons, errors, d.handle)
            if reasons is None and (d.uuid, "clocks_event_reasons") in f.unsupported:
                # Drivers before 535 know the call by its older name only.
                reasons = f.field(d.uuid, "clocks_throttle_reasons",
                                  pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, errors,
                                  d.handle)
        clock = f.field(d.uuid, "sm_clock", pynvml.nvmlDeviceGetClockInfo, errors, d.handle,
                        _CLOCK_SM)
        if d.uuid not in self._max_clock:
            self._max_clock[d.uuid] = f.field(d.uuid, "sm_clock_max",
                                              pynvml.nvmlDeviceGetMaxClockInfo, errors,
                                              d.handle, _CLOCK_SM)
        return HealthReading(
            violations_ns=tuple(violations), counters=tuple(counters),
            sm_clock_mhz=None if clock is None else int(clock),
            sm_clock_max_mhz=self._max_clock[d.uuid],
            clocks_event_reasons=None if reasons is None else int(reasons),
            clocks_event_reasons_supported=None if supported is None else int(supported))

    def _counters(self, d: Device, errors: list[str]) -> list[tuple[str, int]]:
        f = self.fields
        out: list[tuple[str, int]] = []
        rows = f.field(d.uuid, "remapped_rows", pynvml.nvmlDeviceGetRemappedRows, errors,
                       d.handle)
        if rows is not None:
            out += [("remapped_rows:correctable", int(rows[0])),
                    ("remapped_rows:uncorrectable", int(rows[1]))]
        replays = f.field(d.uuid, "pcie_replays", pynvml.nvmlDeviceGetPcieReplayCounter,
                          errors, d.handle)
        if replays is not None:
            out.append(("pcie_replays", int(replays)))
        totals = self._nvlink_totals(d, errors)
        if totals is not None:
            return out + totals
        links = self._active_links(d)
        for kind, counter in NVLINK_COUNTERS.items():
            total, any_read = 0, False
            for link in links:
                value = f.field(d.uuid, f"nvlink_{kind}", pynvml.nvmlDeviceGetNvLinkErrorCounter,
                                errors, d.handle, link, counter)
                if value is not None:
                    total, any_read = total + int(value), True
            if any_read:
                out.append((f"nvlink:{kind}", total))
        return out

    def _nvlink_totals(self, d: Device, errors: list[str]) -> list[tuple[str, int]] | None:
        """The NVLink error totals in one field-values call (18 links x 4 counters are 72
        calls otherwise); None where the driver has none of them (read link by link)."""
        values = self.fields.field(d.uuid, "nvlink_totals", pynvml.nvmlDeviceGetFieldValues,
                                   errors, d.handle, list(NVLINK_TOTAL_FIELDS.values()))
        if values is None:
            return None
        out = [(f"nvlink:{kind}", int(v.value.ullVal))
               for kind, v in zip(NVLINK_TOTAL_FIELDS, values, strict=True)
               if v.nvmlReturn == pynvml.NVML_SUCCESS]
        if not out and all(v.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED for v in values):
            self.fields.unsupported.add((d.uuid, "nvlink_totals"))  # not asked again
            return None
        return out

    def _active_links(self, d: Device) -> tuple[int, ...]:
        """The GPU's active NVLinks, found at its first read (none: no NVLink)."""
        if d.uuid not in self._links:
            found = []
            for link in range(NVLINK_MAX_LINKS):
                state = self.fields.optional(d.uuid, "nvlink_state",
                                             pynvml.nvmlDeviceGetNvLinkState, d.handle, link)
                if state is None:
                    if (d.uuid, "nvlink_state") in self.fields.unsupported:
                        break  # no NVLink at all, or no more links
                    continue
                if state == pynvml.NVML_FEATURE_ENABLED:
                    found.append(link)
            self._links[d.uuid] = tuple(found)
        return self._links[d.uuid]

    def forget(self, uuid: str) -> None:
        """A GPU that came back (reset): its links and clocks are found again."""
        self._max_clock.pop(uuid, None)
        self._links.pop(uuid, None)
        self._supported_reasons.pop(uuid, None)

