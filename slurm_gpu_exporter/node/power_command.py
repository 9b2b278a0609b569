"""The node's power from a site command (``ipmitool dcmi power reading``, a Redfish
script), run in a thread of its own at a bounded rate, with a timeout.

The sample never waits for the command: it takes the last reading, and a reading older
than ``max_age`` seconds, a failed run, a timeout or output that is not exactly one
power reading are ``MeterDown``, never zero. The command runs in a session of its own,
so a timeout kills whatever it started too.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

from slurm_gpu_exporter.node.hwmon import MeterDown

__all__ = ["PowerCommand", "parse_power"]

_OUTPUT_LIMIT = 64 * 1024  # more than this from a power reading is not one
# ipmitool dcmi: "    Instantaneous power reading:                   312 Watts"
_DCMI = re.compile(rb"^\s*Instantaneous power reading:\s*(\d+(?:\.\d+)?)\s*Watts\s*$", re.M)
# Anything else: the whole output is one number of watts, "312", "312.5 W", "312 Watts".
_BARE = re.compile(rb"^\s*(\d+(?:\.\d+)?)\s*(?:W|Watts)?\s*$")


def parse_power(output: bytes) -> float:
    """The watts in a command's output; ValueError unless it holds exactly one reading."""
    found = _DCMI.findall(output)
    if len(found) > 1:
        raise ValueError("more than one 'Instantaneous power reading' line")
    if not found:
        m = _BARE.match(output)
        if m is None:
            raise ValueError("neither a number of watts nor an 'Instantaneous power "
                             "reading: N Watts' line")
        found = [m.group(1)]
    return float(found[0])


class PowerCommand:
    """Runs ``argv`` every ``interval`` seconds (at most), each run within ``timeout``."""

    def __init__(self, argv: Sequence[str], interval: float, timeout: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not argv:
            raise ValueError("the node power command is empty")
        self.argv = list(argv)
        self.interval = interval
        self.timeout = timeout
        # A reading this old means the runs stopped giving readings.
        self.max_age = 2 * interval + timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._watts: float | None = None
        self._at = 0.0
        self._error = f"{self.argv[0]} has not answered yet"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def describe(self) -> str:
        return f"command {self.argv[0]}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="node-power", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 5 if timeout is None else timeout)

    def read(self) -> float:
        """The last reading in watts; raises MeterDown when the last run failed or the
        last good reading is too old."""
        with self._lock:
            watts, at, error = self._watts, self._at, self._error
        if error:
            raise MeterDown(error)
        if watts is None or self._clock() - at > self.max_age:
            raise MeterDown(f"{self.argv[0]} gave no reading for {self.max_age:g} s")
        return watts

    def run_once(self) -> None:
        """One run of the command; its reading or its error kept for ``read``."""
        try:
            watts, error = self._measure(), ""
        except MeterDown as exc:
            watts, error = None, str(exc)
        with self._lock:
            self._error = error
            if watts is not None:
                self._watts, self._at = watts, self._clock()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = self._clock()
            self.run_once()
            # Never faster than the interval, however quickly the command fails.
            self._stop.wait(max(0.0, self.interval - (self._clock() - started)))

    def _measure(self) -> float:
        name = self.argv[0]
        try:
            proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise MeterDown(f"cannot run {name}: {exc.strerror or exc}") from None
        try:
            out, err = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            _kill_session(proc)
            raise MeterDown(f"{name} gave no answer within {self.timeout:g} s") from None
        if proc.returncode != 0:
            last = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
            raise MeterDown(f"{name} exited with status {proc.returncode}: "
                            f"{last[0][:200]!r}")
        if len(out) > _OUTPUT_LIMIT:
            raise MeterDown(f"{name} printed over {_OUTPUT_LIMIT} bytes; not a power reading")
        try:
            return parse_power(out)
        except ValueError as exc:
            raise MeterDown(f"{name} printed no power reading: {exc}") from None


def _kill_session(proc: subprocess.Popen[bytes]) -> None:
    """End the command and what it started (its own session, made at the start)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()
