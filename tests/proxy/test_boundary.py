"""The proxy is its own product: it reaches the agent's code only for the web config."""

from __future__ import annotations

import ast
from pathlib import Path

PROXY = Path(__file__).resolve().parents[2] / "slurm_gpu_exporter" / "proxy"
ALLOWED = {"slurm_gpu_exporter", "slurm_gpu_exporter.web.config"}


def test_the_proxy_imports_no_agent_module_but_the_web_config_reader() -> None:
    outside = set()
    for path in PROXY.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            outside |= {(path.name, n) for n in names if n.startswith("slurm_gpu_exporter")
                        and not n.startswith("slurm_gpu_exporter.proxy") and n not in ALLOWED}
    assert not outside
