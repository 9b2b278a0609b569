"""gpu/'s own layers run one way: its folders (attribution/, driver/, nvml/) and its
top-level modules (backend.py, polling.py, ...) never import each other in a circle.

The graph is read from the source with ``ast``. Every import counts: at a module's top,
inside a function, and under ``TYPE_CHECKING``. An import in a function is still a
dependency that merely dodges the import machinery, and a type-only import still means
neither side reads without the other; both would hide a circle, not remove it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import REPO

GPU = REPO / "slurm_gpu_exporter" / "gpu"
PREFIX = "slurm_gpu_exporter.gpu"
Graph = dict[str, set[str]]


def _part_of(path: Path, root: Path) -> str | None:
    """The layer of a file under ``root``: its folder, or its own name at the top."""
    parts = path.relative_to(root).parts
    if len(parts) > 1:
        return parts[0]
    return None if parts[0] == "__init__.py" else parts[0].removesuffix(".py")


def _layer_of_module(name: str, root: Path, prefix: str) -> str | None:
    """The layer of a dotted module name under ``prefix`` (None: not one of gpu/'s)."""
    if not name.startswith(prefix + "."):
        return None
    first = name[len(prefix) + 1:].split(".")[0]
    if (root / first).is_dir() or (root / f"{first}.py").is_file():
        return first
    return None


def _imported_names(path: Path, root: Path, prefix: str) -> set[str]:
    """Every dotted name ``path`` imports, wherever the import sits; ``from a import b``
    gives ``a`` and ``a.b`` (b may be a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: from the file's own package up
                package = (prefix, *path.parent.relative_to(root).parts)
                base = ".".join(package[:len(package) - node.level + 1])
                module = f"{base}.{module}" if module else base
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def layer_graph(root: Path = GPU, prefix: str = PREFIX) -> Graph:
    """Each folder or top-level module of ``root`` -> the others it imports."""
    graph: Graph = {}
    for path in sorted(root.rglob("*.py")):
        layer = _part_of(path, root)
        if layer is None:
            continue
        edges = graph.setdefault(layer, set())
        for name in _imported_names(path, root, prefix):
            other = _layer_of_module(name, root, prefix)
            if other is not None and other != layer:
                edges.add(other)
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """One circle per back edge a depth-first walk meets, each as a path that ends
    where it starts ("backend", "driver", "backend")."""
    found: list[list[str]] = []
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> None:
        path.append(node)
        for other in sorted(graph.get(node, ())):
            if other in path:
                found.append([*path[path.index(other):], other])
            elif other not in done:
                visit(other)
        path.pop()
        done.add(node)

    for node in sorted(graph):
        if node not in done:
            visit(node)
    return found


def edge_list(graph: Graph) -> str:
    return "\n".join(f"{a} -> {b}" for a in sorted(graph) for b in sorted(graph[a]))


def test_gpu_folders_and_modules_import_each_other_in_no_circle() -> None:
    graph = layer_graph()
    found = cycles(graph)
    assert found == [], (
        "import circles in gpu/: " + "; ".join(" -> ".join(c) for c in found)
        + "\nedges:\n" + edge_list(graph))


def test_the_shared_readings_import_nothing_of_gpu() -> None:
    """gpu/readings.py holds the plain types every layer of gpu/ reads: the bottom."""
    assert layer_graph()["readings"] == set()


def test_a_circle_through_a_function_or_type_checking_import_is_found(tmp_path: Path
                                                                     ) -> None:
    root = tmp_path / "gpu"
    (root / "low").mkdir(parents=True)
    (root / "low" / "parts.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.gpu.top import Thing\n")
    (root / "top.py").write_text("from pkg.gpu.low.parts import Part\n")
    (root / "side.py").write_text(
        "def late():\n    from pkg.gpu import top\n"
        "from .low import parts\n")
    graph = layer_graph(root, "pkg.gpu")
    assert graph == {"low": {"top"}, "top": {"low"}, "side": {"top", "low"}}
    assert cycles(graph) == [["low", "top", "low"]]
    (root / "low" / "parts.py").write_text("def late():\n    import pkg.gpu.side\n")
    assert cycles(layer_graph(root, "pkg.gpu")) == [["low", "side", "low"],
                                                    ["low", "side", "top", "low"]]
