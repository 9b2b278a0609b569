"""The state directory: what must survive an agent restart.

Per-job counters (CPU seconds gathered from processes, GPU busy/allocated
seconds and energy) and memory peaks are saved after every sample that changed
them, atomically, so that a restart never makes a counter go down. A sample that
changed nothing writes nothing (no write, no fsync). A state file that cannot be
read is moved aside (never deleted) and the agent starts fresh.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

STATE_VERSION = 1
STATE_FILE = "state.json"


class StateStore:
    """Load and save one JSON document in the state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / STATE_FILE
        # What the last successful save wrote: the same document is not written again.
        self._saved: str | None = None

    def load(self) -> dict[str, Any]:
        """The saved state, or {} when there is none or it is unreadable."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.warning("cannot read state file %s: %s; counters start from their current "
                        "values", self.path, exc.strerror)
            return {}
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
                raise ValueError(f"unknown state format (version {data.get('version')!r})"
                                 if isinstance(data, dict) else "not a JSON object")
        except ValueError as exc:
            aside = self.path.with_name(f"{STATE_FILE}.corrupt-{int(time.time())}")
            try:
                os.replace(self.path, aside)
                where = f"moved aside to {aside}"
            except OSError:
                where = "left in place"
            log.warning("state file %s is unusable (%s); %s, starting fresh",
                        self.path, exc, where)
            return {}
        return data

    def save(self, data: dict[str, Any]) -> bool:
        """Write the state atomically unless it is what the last save wrote and that file
        is still in place; True when written. Raises OSError (the caller counts it)."""
        payload = json.dumps({**data, "version": STATE_VERSION}, separators=(",", ":"))
        if payload == self._saved and self.path.exists():
            return False
        self._saved = None
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        tmp = self.path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._saved = payload
        return True


# -- driver sample cursors ----------------------------------------------------
# A cursor is a driver timestamp, and drivers stamp on clocks that restart with the
# boot (CLOCK_BOOTTIME) or with the driver: saved cursors carry the boot id and the
# driver version they were read in, and are good for that boot and driver only.

BOOT_ID_PATH = Path("sys/kernel/random/boot_id")


def read_boot_id(proc_root: Path) -> str | None:
    """This boot's id (``/proc/sys/kernel/random/boot_id`` under ``proc_root``); None
    where it cannot be read."""
    try:
        text = (proc_root / BOOT_ID_PATH).read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    boot_id = text.strip()
    return boot_id if 0 < len(boot_id) <= 64 else None


def stamp_cursors(by_gpu: dict[str, Any], boot_id: str | None,
                  driver: str | None) -> dict[str, Any]:
    """The cursors as saved: per GPU, with the boot and the driver version they are of."""
    return {"boot_id": boot_id, "driver": driver, "gpus": by_gpu}


def cursors_of_this_boot(saved: Any, boot_id: str | None) -> tuple[dict[str, Any], str | None]:
    """The saved cursors by GPU and the driver version they were read from; none where
    they were saved in another boot, or in a form this version does not read."""
    if not isinstance(saved, dict) or not isinstance(saved.get("gpus"), dict):
        return {}, None
    if saved.get("boot_id") != boot_id:
        log.info("the driver sample cursors in the state dir are from another boot; they are "
                 "dropped and each GPU's first poll starts afresh")
        return {}, None
    driver = saved.get("driver")
    return saved["gpus"], driver if isinstance(driver, str) else None
