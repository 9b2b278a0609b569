"""The node role's client config of slurm-gpu-report, applied for real with
ansible-playbook (site.yml's login-node play, ``connection: local``): with a proxy URL
it writes the file (0644, root) that ``slurm-gpu-report`` reads, with the URL empty it
writes nothing, and a value that would change the file's meaning stops the role. The
file's path points into a temporary directory, so nothing of /etc is written."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from slurm_gpu_exporter.report.cli.client_config import ClientConfig, load_client_config
from tests.system.deploy.local_play import changed, play

pytestmark = pytest.mark.process



def _play(base: Path, **extra: object) -> subprocess.CompletedProcess[str]:
    return play(base, "login_nodes", {"slurm_gpu_exporter_client_config":
                                      str(base / "etc" / "client.toml"), **extra})


def test_the_written_client_config_is_what_the_report_reads(tmp_path: Path) -> None:
    settings = {"slurm_gpu_exporter_client_proxy_url": "https://proxy.example.org:9818",
                "slurm_gpu_exporter_client_ca_file": "/etc/ssl/certs/site-ca.pem",
                "slurm_gpu_exporter_client_munge_socket": "/run/munge/other.socket"}
    assert changed(_play(tmp_path, **settings)) == 2  # the directory and the file
    path = tmp_path / "etc" / "client.toml"
    info = path.stat()
    assert (info.st_mode & 0o7777, info.st_uid, info.st_gid) == (0o644, 0, 0)
    assert load_client_config(path) == ClientConfig(
        prometheus_url="https://proxy.example.org:9818", auth="munge",
        ca_file="/etc/ssl/certs/site-ca.pem", munge_socket="/run/munge/other.socket")
    assert changed(_play(tmp_path, **settings)) == 0
    _play(tmp_path, slurm_gpu_exporter_client_proxy_url="http://proxy:9818",
          slurm_gpu_exporter_client_auth="none")
    assert load_client_config(path) == ClientConfig(prometheus_url="http://proxy:9818",
                                                    auth="none")


def test_no_proxy_url_writes_no_client_config(tmp_path: Path) -> None:
    assert changed(_play(tmp_path)) == 0
    assert not (tmp_path / "etc").exists()


@pytest.mark.parametrize("bad", [
    {"slurm_gpu_exporter_client_proxy_url": 'https://p:9818"\nauth = "none'},
    {"slurm_gpu_exporter_client_proxy_url": "proxy:9818"},
    {"slurm_gpu_exporter_client_proxy_url": "https://p", "slurm_gpu_exporter_client_auth":
     "basic"},
    {"slurm_gpu_exporter_client_proxy_url": "https://p",
     "slurm_gpu_exporter_client_ca_file": "/a b.pem"},
])
def test_a_value_that_would_change_the_files_meaning_stops_the_role(
        tmp_path: Path, bad: dict[str, str]) -> None:
    run = _play(tmp_path, **bad)
    assert run.returncode != 0, run.stdout[-2000:]
    assert not (tmp_path / "etc" / "client.toml").exists()
