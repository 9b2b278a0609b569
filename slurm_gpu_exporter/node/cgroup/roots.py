"""Where Slurm's cgroup trees are on this node, looked up again when they may have moved.

Where those roots are is looked up again every ``rescan_interval`` seconds, when one
vanishes, and on every call while a job is new (seen, or expected by the caller, for
less than ``NEW_JOB_WINDOW_S``): slurmd makes some v1 roots (cpuset, devices) only at
the first job after it starts, and a new scope appears with its first job. On v1 such
a call lists only the hierarchies that have no Slurm root yet.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from slurm_gpu_exporter.node.cgroup.files import UNIFIED
from slurm_gpu_exporter.node.cgroup.v1 import scan_v1_roots, slurm_tops
from slurm_gpu_exporter.node.cgroup.v2 import scan_v2_roots

__all__ = ["NEW_JOB_WINDOW_S", "RootTracker", "cgroup_version"]

# Seconds after a job is first seen (or first expected) during which every call
# looks for Slurm roots that appeared late.
NEW_JOB_WINDOW_S = 10.0


def cgroup_version(root: Path) -> int:
    """2 on a pure cgroup v2 mount, else 1.

    A hybrid mount (v1 controllers plus a ``unified`` cgroup2 tree) counts as v1:
    Slurm's cgroup/v1 plugin drives the v1 controllers there and the unified
    tree carries no controllers.
    """
    return 2 if (root / "cgroup.controllers").exists() else 1


class RootTracker:
    """Slurm's tree roots under one cgroup mount: (controllers, root path) pairs."""

    def __init__(self, root: Path, rescan_interval: float) -> None:
        self.root = root
        self._rescan_interval = rescan_interval
        self.roots: list[tuple[frozenset[str], str]] = []  # (controllers, Slurm tree root)
        self.version = 0
        self._scanned_at: float | None = None
        # v1 hierarchies (real path -> controllers) without a Slurm root at the last scan.
        self._bare: dict[str, frozenset[str]] = {}
        # job key -> when it was first seen or expected, while it is new.
        self._new_since: dict[str, float] = {}

    def current(self, now: float) -> list[tuple[frozenset[str], str]]:
        """The roots, scanned again when the last scan is older than the interval."""
        if (
            not self.roots
            or self._scanned_at is None
            or now - self._scanned_at >= self._rescan_interval
        ):
            self.version = cgroup_version(self.root)
            if self.version == 2:
                self._bare = {}
                self._set([(frozenset({UNIFIED}), p) for p in scan_v2_roots(self.root)])
            else:
                roots, self._bare = scan_v1_roots(self.root)
                self._set(roots)
            self._scanned_at = now
        return self.roots

    def forget(self) -> None:
        """A root vanished: look for the roots again at the next call."""
        self._scanned_at = None

    def track_new(self, now: float, found: Mapping[str, object], expected: Iterable[str]
                  ) -> bool:
        """Note first sightings; True while some job is new enough to look for late roots."""
        wanted = set(found)
        wanted.update(expected)
        for key in wanted:
            self._new_since.setdefault(key, now)
        self._new_since = {k: t for k, t in self._new_since.items() if k in wanted}
        return any(now - t < NEW_JOB_WINDOW_S for t in self._new_since.values())

    def rescan_late(self) -> bool:
        """Look for roots made after the last scan; True when the roots changed."""
        if self.version == 2:
            roots = [(frozenset({UNIFIED}), p) for p in scan_v2_roots(self.root)]
        elif self._bare:
            roots = list(self.roots)
            for real, names in self._bare.items():
                roots.extend((names, p) for p in slurm_tops(real))
        else:
            return False
        if roots == self.roots:
            return False
        self._set(roots)
        return True

    def _set(self, roots: list[tuple[frozenset[str], str]]) -> None:
        self.roots = sorted(roots, key=lambda root: root[1])
        if self.version == 1:
            rooted = {os.path.dirname(path) for _, path in self.roots}
            self._bare = {real: names for real, names in self._bare.items() if real not in rooted}
