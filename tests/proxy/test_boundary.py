"""The proxy is its own product: it reaches the agent's code only for the web layer
every server shares (listening, the connection guard, the web config and its basic
auth, stopping, logging), the report's code only for the job archive
(``--archive.url``), loaded inside functions of proxy/archive.py so that a plain
install (no ``archive`` extra) runs it, and shares with both only the bottom layer
every product may import (``model/``)."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tests.support import REPO

ROOT = REPO
PROXY = ROOT / "slurm_gpu_exporter" / "proxy"
# The web layer every server shares (none of the agent's exposition).
ALLOWED = {"slurm_gpu_exporter", "slurm_gpu_exporter.web.config",
           "slurm_gpu_exporter.web.connections", "slurm_gpu_exporter.web.listen",
           "slurm_gpu_exporter.web.middleware", "slurm_gpu_exporter.web.serve",
           "slurm_gpu_exporter.web.logging_setup", "slurm_gpu_exporter.web.basic_auth"}
# The bottom layer of every product: job identity, user names, the munge wire format.
SHARED_BOTTOM = "slurm_gpu_exporter.model."
# What archive.py may load, inside its functions only.
ARCHIVE_ONLY = {"slurm_gpu_exporter.report.archive.store", "slurm_gpu_exporter.report.errors",
                "slurm_gpu_exporter.report.figures.detail_data"}


def _names(node: ast.AST) -> list[str]:
    return ([a.name for a in node.names] if isinstance(node, ast.Import)
            else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])


def test_the_proxy_imports_no_agent_module_but_the_shared_web_layer() -> None:
    outside = set()
    for path in PROXY.glob("*.py"):
        allowed = ALLOWED | (ARCHIVE_ONLY if path.name == "archive.py" else set())
        for node in ast.walk(ast.parse(path.read_text())):
            outside |= {(path.name, n) for n in _names(node)
                        if n.startswith("slurm_gpu_exporter")
                        and not n.startswith(("slurm_gpu_exporter.proxy", SHARED_BOTTOM))
                        and n not in allowed}
    assert not outside


def test_the_archive_is_imported_only_inside_functions() -> None:
    top = {n for node in ast.parse((PROXY / "archive.py").read_text()).body
           for n in _names(node)}
    assert not top & ARCHIVE_ONLY


@pytest.mark.process
def test_starting_the_proxy_loads_neither_the_report_nor_a_database_library() -> None:
    code = ("import sys, slurm_gpu_exporter.proxy.cli\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', "
            "'psycopg') or m.startswith('slurm_gpu_exporter.report')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]"
