"""What the agent imports at start-up: optional features' libraries only when the
feature is configured. Every module stays in the agent's resident memory for its
whole life (issue 49: yaml, bcrypt and statistics' decimal/fractions were 2 MiB of an
agent that most sites run without a web config)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.process

# Imported only where a web config file asks for them (web/config.py), or never.
OPTIONAL = ("yaml", "bcrypt", "statistics", "decimal", "fractions")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(*sys.modules)"],
                         capture_output=True, text=True, check=True, timeout=60)
    return set(out.stdout.split())


def test_the_agent_starts_without_the_optional_features_libraries() -> None:
    loaded = _modules_after("import slurm_gpu_exporter.agent.cli")
    assert "slurm_gpu_exporter.web.config" in loaded  # the check sees the agent's modules
    assert not loaded & set(OPTIONAL), sorted(loaded & set(OPTIONAL))


def test_a_web_config_with_users_brings_yaml_and_bcrypt_in(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The feature still works lazily: a config file is parsed and a password checked.
    import base64

    import bcrypt

    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=4)).decode()
    good, bad = (base64.b64encode(f"alice:{p}".encode()).decode() for p in ("secret", "x"))
    (tmp_path / "web.yml").write_text(f"basic_auth_users:\n  alice: '{hashed}'\n")
    loaded = _modules_after(
        "from pathlib import Path\n"
        "from slurm_gpu_exporter.web.basic_auth import BasicAuth\n"
        "from slurm_gpu_exporter.web.config import load_web_config\n"
        f"c = load_web_config(Path({str(tmp_path / 'web.yml')!r}))\n"
        f"assert BasicAuth().check(c, 'Basic {good}') is True\n"
        f"assert BasicAuth().check(c, 'Basic {bad}') is False\n")
    assert {"yaml", "bcrypt"} <= loaded
