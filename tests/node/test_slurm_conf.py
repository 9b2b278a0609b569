"""slurm.conf's ClusterName, as the agent reads it for slurm_gpu_exporter_node_info."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gpu_exporter.node.slurm.conf import cluster_name, read_cluster_name, slurm_conf_path


@pytest.mark.parametrize(("text", "expected"), [
    ("ClusterName=c1\n", "c1"),
    ("# ClusterName=old\nSlurmctldHost=head\nclustername = Big-Iron  # the site\n", "big-iron"),
    ("SlurmctldHost=head\n", ""),
    ("ClusterName=\n", ""),
    ("NodeName=gpu01 Gres=gpu:4\nClusterName=after\n", "after"),
])
def test_cluster_name_is_slurms_lowercased_value(text: str, expected: str) -> None:
    assert cluster_name(text) == expected


def test_unreadable_slurm_conf_is_no_cluster(tmp_path: Path) -> None:
    assert read_cluster_name(tmp_path / "absent.conf") == ""
    conf = tmp_path / "slurm.conf"
    conf.write_bytes(b"ClusterName=gpu\xff\n")
    assert read_cluster_name(conf) == "gpu\ufffd"


def test_slurm_conf_env_is_where_slurm_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", "/site/slurm.conf")
    assert slurm_conf_path() == Path("/site/slurm.conf")
    monkeypatch.delenv("SLURM_CONF")
    assert slurm_conf_path() == Path("/etc/slurm/slurm.conf")
