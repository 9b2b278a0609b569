"""The cluster's name from slurm.conf (``ClusterName``), read once when the agent starts.

It goes on ``slurm_gpu_exporter_node_info`` beside the node's Slurm name, so a store
that holds several clusters can tell which one a target belongs to.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_SLURM_CONF = Path("/etc/slurm/slurm.conf")
# slurm.conf is a few KiB; a larger file is not one to search line by line.
MAX_CONF_BYTES = 4 << 20


def slurm_conf_path() -> Path:
    """Where Slurm's own commands read slurm.conf: ``SLURM_CONF``, else the default."""
    return Path(os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF)


def cluster_name(text: str) -> str:
    """``ClusterName`` in slurm.conf's text, lowercased as Slurm does; '' when absent.

    Keys are case-insensitive and ``#`` starts a comment (Slurm's own rules)."""
    for line in text.splitlines():
        key, sep, value = line.split("#", 1)[0].partition("=")
        if sep and key.strip().lower() == "clustername":
            words = value.split()
            return words[0].lower() if words else ""
    return ""


def read_cluster_name(path: Path) -> str:
    """``ClusterName`` of the slurm.conf at ``path``; '' when it cannot be read."""
    try:
        with path.open("rb") as conf:
            data = conf.read(MAX_CONF_BYTES)
    except OSError:
        return ""
    return cluster_name(data.decode("utf-8", "replace"))
