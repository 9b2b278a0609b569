"""What slowed a job's GPUs and what went wrong on them: throttled time by reason and
error counts (Xid, ECC, row remapping, PCIe replays, NVLink), per GPU, as plain data.

The agent counts each from the job's start, for the time the job held the GPU. A
reason the GPU does not report has no entry (not 0); an error kind that never
happened may have none either.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

# NVML's clock-event reasons, as the agent's ``reason`` label names them, in the order
# the reports list them.
REASONS = ("power", "thermal", "board_limit", "reliability", "sync_boost",
           "low_utilization", "app_clocks", "base_clocks")
# The reasons where the GPU itself held a busy job back. low_utilization follows from
# idleness; app_clocks, base_clocks and sync_boost are clock settings or their outcome.
SLOWING = ("power", "thermal", "board_limit", "reliability")
# How each reason reads in a sentence: "GPU 3 was power-capped 23 % of ..."
WORDING = {
    "power": "power-capped", "thermal": "thermally throttled",
    "board_limit": "held at the board's limit", "reliability": "slowed for reliability",
    "sync_boost": "held back by sync boost", "low_utilization": "clocked down as idle",
    "app_clocks": "held at its application clocks", "base_clocks": "below its base clocks",
}
# Error kinds, as the ``event`` label of the report's query names them (queries.py).
FAULT_KINDS = ("xid", "ecc", "remapped_rows", "pcie_replays", "nvlink")
FAULT_WORDS = {"ecc": "ECC errors", "remapped_rows": "remapped rows",
               "pcie_replays": "PCIe replays", "nvlink": "NVLink errors"}


@dataclass
class Throttle:
    """Seconds one GPU was slowed for one reason while the job held it."""

    reason: str
    seconds: float


@dataclass
class GpuFault:
    """Errors of one kind (and code or type) on one GPU while the job held it."""

    kind: str  # one of FAULT_KINDS
    detail: str = ""  # the Xid code, ECC type, remap cause or NVLink kind; "" for PCIe
    count: float = 0.0
    last: float | None = None  # Unix time of the job's last one (Xid only)

    def text(self, gpu: str) -> str:
        """``Xid 79 at 14:03 UTC on GPU 1``, ``2 ECC errors (uncorrected) on GPU 1``."""
        times = f" ({self.count:.0f} times)" if self.count > 1 else ""
        if self.kind == "xid":
            at = f" at {clock(self.last)}" if self.last is not None else ""
            return f"Xid {self.detail}{at} on GPU {gpu}{times}"
        what = FAULT_WORDS.get(self.kind, self.kind)
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.count:.0f} {what}{detail} on GPU {gpu}"


def clock(t: float) -> str:
    """A time of day as the notes say it: ``14:03 UTC``."""
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M UTC")


def share(seconds: float, whole: float) -> float | None:
    """``seconds`` as a share of ``whole``, at most 1; None for no whole."""
    return min(1.0, seconds / whole) if whole > 0 else None


def reason_order(reason: str) -> tuple[int, str]:
    return (REASONS.index(reason) if reason in REASONS else len(REASONS), reason)


@dataclass(frozen=True)
class Slowdown:
    """The GPU a job's note names: the largest share of busy time one slowing reason
    took on one GPU."""

    gpu: str  # "3", or "3 on node7" for a job on several nodes
    reason: str
    busy_ratio: float  # of the time the GPU was busy
    held_ratio: float | None  # of the time the job held it

    @property
    def words(self) -> str:
        return WORDING.get(self.reason, self.reason)
