"""How the package is laid out: each folder is a layer, which layers it may import, and
how big its modules and classes grow."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "slurm_gpu_exporter"
TOP = "<top>"  # the package's own __init__ (its version), which imports nothing

# For each layer (a subpackage, or a module at the top), the other layers it may import.
# From the bottom: model is the pure job model every layer shares; hooks run inside
# slurmd's prolog (stdlib only); node reads the
# node; exposition is pure (no I/O); jobs, then gpu and the training relay decide;
# sampling runs them all; web serves what exposition made. sim, agent, check are the
# commands on top; report and proxy are their own products.
AGENT_LAYERS = {"model", "hooks", "node", "exposition", "jobs", "gpu", "training_relay",
                "sampling", "web", "sim"}
MAY_IMPORT: dict[str, set[str]] = {
    "model": set(),
    "hooks": {"model"},
    "node": {"model", "hooks"},
    "exposition": {TOP, "model"},
    "web": {TOP, "model", "exposition"},
    "jobs": {"model", "hooks", "node", "exposition"},
    "gpu": {"model", "hooks", "node", "jobs", "exposition"},
    "training_relay": {"model", "hooks", "node", "jobs", "exposition"},
    "sampling": {"model", "hooks", "node", "jobs", "gpu", "training_relay", "exposition"},
    # sim/fleet renders simulated nodes with the agent's own exposition code.
    "sim": {"model", "hooks", "node", "gpu", "exposition"},
    "agent": {TOP, "check"} | AGENT_LAYERS,
    "check": {TOP, "agent", "model", "hooks", "node", "gpu", "training_relay"},
    "report": {TOP, "web"},
    "proxy": {TOP, "web"},  # only web.config: tests/proxy/test_boundary.py
    "training": set(),  # the client library jobs import: stdlib and prometheus-client
}
# Modules a layer may not import though their layer is allowed: the sampler publishes
# snapshots through a callback and renders nothing (the web holder does).
MAY_NOT_IMPORT: dict[str, set[str]] = {
    "sampling": {"slurm_gpu_exporter.exposition.metrics"},
}
# Layers that read files, list directories, run commands or load NVML.
IO_LAYERS = {"hooks", "node", "jobs", "gpu", "training_relay", "sampling", "sim", "agent",
             "check"}

MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 200
# Files over the limits, each with why it is allowed for now (none).
SIZE_ALLOWED: dict[str, str] = {}


def _layer_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0].removesuffix(".py") if len(parts) == 1 else parts[0]


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import; name the layer"
            names.add(node.module or "")
    return names


def _layers_imported(path: Path) -> set[str]:
    """The layers of our own package that ``path`` imports."""
    layers = set()
    for name in _imports(path):
        parts = name.split(".")
        if parts[0] == "slurm_gpu_exporter":
            layers.add(parts[1] if len(parts) > 1 else TOP)
    return layers


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "__init__.py")


def test_every_module_belongs_to_a_layer_with_rules() -> None:
    """A new folder (or top-level module) says in MAY_IMPORT which layers it sits on."""
    assert {_layer_of(p) for p in _modules()} <= set(MAY_IMPORT)


@pytest.mark.parametrize("layer", sorted(MAY_IMPORT))
def test_a_layer_imports_only_the_layers_it_sits_on(layer: str) -> None:
    wrong = {
        f"{path.relative_to(PACKAGE)} imports {sorted(extra)}"
        for path in _modules() if _layer_of(path) == layer
        if (extra := _layers_imported(path) - MAY_IMPORT[layer] - {layer})
    }
    assert wrong == set()


@pytest.mark.parametrize("layer", sorted(MAY_NOT_IMPORT))
def test_a_layer_imports_none_of_the_modules_kept_from_it(layer: str) -> None:
    wrong = {
        f"{path.relative_to(PACKAGE)} imports {sorted(banned)}"
        for path in _modules() if _layer_of(path) == layer
        if (banned := _imports(path) & MAY_NOT_IMPORT[layer])
    }
    assert wrong == set()


def test_hooks_import_only_the_standard_library() -> None:
    known = set(sys.stdlib_module_names) | {"__future__", "slurm_gpu_exporter"}
    outside = {
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in (PACKAGE / "hooks").glob("*.py")
        for name in _imports(path) if name.split(".")[0] not in known
    }
    assert outside == set()


def test_exposition_and_web_sit_on_no_layer_that_does_io() -> None:
    for layer in ("exposition", "web"):
        assert MAY_IMPORT[layer] & IO_LAYERS == set()


def _imported_package_modules(module: str) -> set[str]:
    """The package's modules loaded by importing ``module`` in a fresh interpreter."""
    code = (
        f"import sys, {module}\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('slurm_gpu_exporter')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize("module", ["slurm_gpu_exporter.exposition.snapshot",
                                    "slurm_gpu_exporter.exposition.metrics",
                                    "slurm_gpu_exporter.web.server"])
@pytest.mark.process
def test_exposition_side_loads_no_module_that_does_io(module: str) -> None:
    loaded = _imported_package_modules(module)
    assert module in loaded
    assert {m for m in loaded if m.count(".") and m.split(".")[1] in IO_LAYERS} == set()


@pytest.mark.process
def test_job_hooks_import_only_the_standard_library_and_their_own_modules() -> None:
    code = (
        "import sys, slurm_gpu_exporter.hooks.jobhooks\n"
        "known = set(sys.stdlib_module_names) | {'__main__'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} - known))\n"
        "print(sorted(m for m in sys.modules if m.startswith('slurm_gpu_exporter.')))"
    )
    # -S: without site-packages, anything beyond the stdlib fails to import.
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    third_party, ours = out.stdout.splitlines()
    assert third_party == "['slurm_gpu_exporter']"
    assert ours == ("['slurm_gpu_exporter.hooks', 'slurm_gpu_exporter.hooks.ids', "
                    "'slurm_gpu_exporter.hooks.jobhooks', 'slurm_gpu_exporter.hooks.spool']")


def test_cgroups_keeps_its_public_names() -> None:
    """Other layers import these from slurm_gpu_exporter.node.cgroup, the package's API."""
    import slurm_gpu_exporter.node.cgroup as cgroups

    for name in cgroups.__all__:
        assert getattr(cgroups, name) is not None


def _sizes() -> list[tuple[str, str, int]]:
    """(file, class or "", lines) for every module and class of the package."""
    sizes = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        text = path.read_text()
        sizes.append((rel, "", len(text.splitlines())))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                sizes.append((rel, node.name, node.end_lineno - node.lineno + 1))
    return sizes


def test_no_module_over_400_lines_and_no_class_over_200() -> None:
    too_big = [
        f"{rel}{':' + cls if cls else ''} has {lines} lines"
        for rel, cls, lines in _sizes()
        if rel not in SIZE_ALLOWED and lines > (MAX_CLASS_LINES if cls else MAX_MODULE_LINES)
    ]
    assert too_big == [], "split along the sections it has: " + "; ".join(too_big)


def test_size_allow_list_names_only_files_that_need_it() -> None:
    """An allowed file that shrank under the limits leaves the list."""
    over = {rel for rel, cls, lines in _sizes()
            if lines > (MAX_CLASS_LINES if cls else MAX_MODULE_LINES)}
    assert over >= set(SIZE_ALLOWED)
