"""The node role's client config of slurm-gpu-report, applied for real with
ansible-playbook (site.yml's login-node play, ``connection: local``): with a proxy URL
it writes the file (0644, root) that ``slurm-gpu-report`` reads, with the URL empty it
writes nothing, and a value that would change the file's meaning stops the role. The
file's path points into a temporary directory, so nothing of /etc is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_gpu_exporter.report.cli.client_config import ClientConfig, load_client_config
from tests.support import REPO, require

pytestmark = pytest.mark.process

ANSIBLE_DIR = REPO / "deploy" / "ansible"
VENV_BIN = Path(sys.executable).parent


def _play(base: Path, **extra: object) -> subprocess.CompletedProcess[str]:
    require((VENV_BIN / "ansible-playbook").exists(), "ansible-playbook (the dev venv's)")
    inventory = base / "inventory.json"
    inventory.write_text(json.dumps({"all": {"children": {"login_nodes": {"hosts": {
        "localhost": {"ansible_connection": "local",
                      "ansible_python_interpreter": sys.executable,
                      "ansible_become": False}}}}}}))
    varfile = base / "vars.json"
    varfile.write_text(json.dumps({"slurm_gpu_exporter_client_config":
                                   str(base / "etc" / "client.toml"), **extra}))
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "0",
           "ANSIBLE_HOME": str(base / "ansible-home"),
           "ANSIBLE_LOCAL_TEMP": str(base / "ansible-tmp")}
    return subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inventory),
                           "site.yml", "-e", f"@{varfile}"], cwd=ANSIBLE_DIR, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def _changed(run: subprocess.CompletedProcess[str]) -> int:
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return int(run.stdout.rsplit("changed=", 1)[1].split()[0])


def test_the_written_client_config_is_what_the_report_reads(tmp_path: Path) -> None:
    settings = {"slurm_gpu_exporter_client_proxy_url": "https://proxy.example.org:9818",
                "slurm_gpu_exporter_client_ca_file": "/etc/ssl/certs/site-ca.pem",
                "slurm_gpu_exporter_client_munge_socket": "/run/munge/other.socket"}
    assert _changed(_play(tmp_path, **settings)) == 2  # the directory and the file
    path = tmp_path / "etc" / "client.toml"
    info = path.stat()
    assert (info.st_mode & 0o7777, info.st_uid, info.st_gid) == (0o644, 0, 0)
    assert load_client_config(path) == ClientConfig(
        prometheus_url="https://proxy.example.org:9818", auth="munge",
        ca_file="/etc/ssl/certs/site-ca.pem", munge_socket="/run/munge/other.socket")
    assert _changed(_play(tmp_path, **settings)) == 0
    _play(tmp_path, slurm_gpu_exporter_client_proxy_url="http://proxy:9818",
          slurm_gpu_exporter_client_auth="none")
    assert load_client_config(path) == ClientConfig(prometheus_url="http://proxy:9818",
                                                    auth="none")


def test_no_proxy_url_writes_no_client_config(tmp_path: Path) -> None:
    assert _changed(_play(tmp_path)) == 0
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
