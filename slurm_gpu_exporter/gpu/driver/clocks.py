"""Which host clock a driver stamps its samples on, and converting between them.

Linux drivers have been seen stamping ``nvmlDeviceGetSamples`` in µs of
``CLOCK_BOOTTIME`` and ``nvmlDeviceGetProcessUtilization`` in µs of the epoch, so
the clock of each call is found, not assumed: its newest sample is compared with
``CLOCK_REALTIME``, ``CLOCK_BOOTTIME`` and ``CLOCK_MONOTONIC`` read right after the
call. Nothing here calls the driver; the host clocks come in as a HostClocks
(gpu/readings.py).
"""

from __future__ import annotations

from slurm_gpu_exporter.gpu.readings import BOOTTIME, MONOTONIC, REALTIME, HostClocks

# In this order of preference where two agree (BOOTTIME = MONOTONIC on a host that
# never slept).
CLOCKS = (REALTIME, BOOTTIME, MONOTONIC)

# The newest sample of a call is at most this old on its clock (process samples
# have been seen 9 s old), and never ahead of it by more than a little.
MAX_SAMPLE_AGE_S = 60.0
MAX_AHEAD_S = 2.0


def clock_of(newest_us: int, at: HostClocks) -> str | None:
    """The clock a call's newest sample (µs) is on, read at ``at`` right after the
    call: the one it is least behind, within MAX_SAMPLE_AGE_S; None where it is on
    none of them (a clock of the driver's own, or a sped-up test clock)."""
    best: tuple[float, str] | None = None
    for clock in CLOCKS:
        reading = at.of(clock)
        if reading is None:
            continue
        behind = reading - newest_us / 1e6
        if -MAX_AHEAD_S <= behind <= MAX_SAMPLE_AGE_S and (
                best is None or abs(behind) < best[0] - 1e-3):
            best = (abs(behind), clock)
    return best[1] if best else None


def wall_to_driver_us(wall: float, clock: str, at: HostClocks) -> int | None:
    """A wall-clock time (epoch s) on a driver clock (µs), None where that clock was not
    read: the offset between the clocks is taken at ``at``."""
    reading = at.of(clock)
    if reading is None:
        return None
    return int((wall - at.realtime + reading) * 1e6)
