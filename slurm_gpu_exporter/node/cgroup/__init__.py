"""Slurm's job cgroups: the API other layers use (``CgroupFS`` and what it returns).

Inside: ``paths`` (the path grammar), ``files`` (small shared readers), ``v1``/``v2``
(one hierarchy each), ``roots`` (where Slurm's trees are), ``inotify`` and ``watch``
(whether Slurm's directories changed since they were listed), ``fs`` (``CgroupFS``).
"""

from slurm_gpu_exporter.node.cgroup.files import UNIFIED
from slurm_gpu_exporter.node.cgroup.fs import CgroupFS, CgroupGone, JobCgroup, JobCgroupStats

__all__ = ["UNIFIED", "CgroupFS", "CgroupGone", "JobCgroup", "JobCgroupStats"]
