"""site.yml played on this machine with the dev venv's ansible-playbook, as the user
the tests run as: localhost is the one host of one inventory group, and the variables
point the role's files into the test's temporary directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support import REPO, require

ANSIBLE_DIR = REPO / "deploy" / "ansible"
VENV_BIN = Path(sys.executable).parent


def play(base: Path, group: str, variables: dict[str, object]
         ) -> subprocess.CompletedProcess[str]:
    """Run site.yml with localhost in ``group``; its state (ANSIBLE_HOME) under ``base``."""
    require((VENV_BIN / "ansible-playbook").exists(), "ansible-playbook (the dev venv's)")
    inventory = base / "inventory.json"
    inventory.write_text(json.dumps({"all": {"children": {group: {"hosts": {
        "localhost": {"ansible_connection": "local",
                      "ansible_python_interpreter": sys.executable,
                      "ansible_become": False}}}}}}))
    varfile = base / "vars.json"
    varfile.write_text(json.dumps(variables))
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "0",
           "ANSIBLE_HOME": str(base / "ansible-home"),
           "ANSIBLE_LOCAL_TEMP": str(base / "ansible-tmp")}
    return subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inventory),
                           "site.yml", "-e", f"@{varfile}"], cwd=ANSIBLE_DIR, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def changed(run: subprocess.CompletedProcess[str]) -> int:
    """How many tasks a successful run changed (its recap's ``changed=``)."""
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return int(run.stdout.rsplit("changed=", 1)[1].split()[0])
