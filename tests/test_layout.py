"""How the package is laid out: each folder is a layer, which layers it may import, and
how big its modules and classes grow. ``slurm-gpu-report`` (``report/``) is a product
whose folders are layers of their own, named ``report.<folder>``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

ROOT = REPO
PACKAGE = ROOT / "slurm_gpu_exporter"
TOP = "<top>"  # the package's own __init__ (its version), which imports nothing
# Products whose folders are layers of their own ("report.archive"); their modules
# directly in the product folder (its __init__, errors.py) are the layer "report".
PRODUCTS = {"report"}

# For each layer (a subpackage, or a module at the top), the other layers it may import.
# From the bottom: model is the one bottom layer every layer and product shares (the job
# model and identity, user names, the munge wire format, the optional extras: standard
# library only, no I/O); hooks run inside
# slurmd's prolog (stdlib only); node reads the
# node; exposition is pure (no I/O); jobs, then gpu and the training relay decide;
# sampling runs them all; web serves what exposition made. sim, agent, check are the
# commands on top (check takes the agent's flags from agent.flags; the agent starts
# check.command for "slurm-gpu-exporter check"); report and proxy are their own products.
#
# slurm-gpu-report, from the bottom: "report" is its one exception (errors.py); figures
# are the job figures, windows and notes (pure); prometheus is the one Prometheus client
# and the PromQL; slurm what is asked of Slurm and the one module that acts on it;
# render and notify show and send; archive, enforce and remediate are the products
# beside the reports, top the live view of one job; cli holds the commands and is the
# only layer that wires the rest.
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
    # sim/fleet renders simulated nodes with the agent's own exposition code; its
    # server stops as every server does (web.serve).
    "sim": {"model", "hooks", "node", "gpu", "exposition", "web"},
    "agent": {TOP, "check"} | AGENT_LAYERS,
    "check": {TOP, "agent", "model", "hooks", "node", "gpu", "training_relay"},
    # model (job identity, user names, the munge wire format, the optional extras) is
    # the bottom of every product too.
    "report": {"model"},
    "report.figures": {"model", "report"},
    "report.prometheus": {"model", "report", "report.figures"},
    "report.slurm": {"model", "report", "report.figures"},
    "report.render": {"model", "report", "report.figures"},
    "report.notify": {"model", "report", "report.figures", "report.render"},
    "report.archive": {"model", "report", "report.figures", "report.prometheus"},
    "report.enforce": {"model", "report", "report.figures", "report.prometheus",
                       "report.slurm", "report.render", "report.notify"},
    "report.remediate": {"model", "report", "report.prometheus", "report.slurm", "web"},
    # top: one running job now (its queries) and its frame (text, no I/O)
    "report.top": {"model", "report", "report.figures", "report.prometheus", "report.render"},
    # mlflow: ended jobs' figures into the MLflow runs that name them (its REST API)
    "report.mlflow": {"model", "report", "report.figures", "report.prometheus"},
    "report.cli": {TOP, "model", "web", "report", "report.figures",
                   "report.prometheus", "report.slurm", "report.render", "report.notify",
                   "report.archive", "report.enforce", "report.remediate", "report.top",
                   "report.mlflow"},
    # only web.config, and the job archive (with the figures it returns and its one
    # exception) inside functions, for --archive.url: tests/proxy/test_boundary.py
    "proxy": {TOP, "model", "web", "report", "report.figures", "report.archive"},
    # MailProg: runs slurm-gpu-report as a command, imports none of it
    "mail": {"model"},
    "training": {"training_mlflow"},  # the client jobs import: stdlib, prometheus-client
    "training_mlflow": set(),  # its MLflow side, loaded where the script uses mlflow
}
# Modules a layer may not import though their layer is allowed: the sampler publishes
# snapshots through a callback and renders nothing (the web holder does); check takes
# the agent's flags, never its wiring.
MAY_NOT_IMPORT: dict[str, set[str]] = {
    "sampling": {"slurm_gpu_exporter.exposition.metrics",
                 "slurm_gpu_exporter.exposition.rendered"},
    "check": {"slurm_gpu_exporter.agent.cli"},
}
# Layers that read files, list directories, run commands or load NVML.
IO_LAYERS = {"hooks", "node", "jobs", "gpu", "training_relay", "sampling", "sim", "agent",
             "check"}

MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 200
# Files over the limits, each with why it is allowed for now (none).
SIZE_ALLOWED: dict[str, str] = {}


def _layer_of(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package).parts
    if parts[0] in PRODUCTS:
        return f"{parts[0]}.{parts[1]}" if len(parts) > 2 else parts[0]
    return parts[0].removesuffix(".py") if len(parts) == 1 else parts[0]


def _import_nodes(path: Path) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``path``, at its top or inside a function."""
    nodes = [node for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, (ast.Import, ast.ImportFrom))]
    for node in nodes:
        assert not isinstance(node, ast.ImportFrom) or node.level == 0, \
            f"{path}: relative import; name the layer"
    return nodes


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function."""
    names: set[str] = set()
    for node in _import_nodes(path):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        else:
            names.add(node.module or "")
    return names


def _top_level_imports(path: Path) -> set[str]:
    """The modules ``path`` imports when it is loaded (not inside a function)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
    return names


def _layer_of_module(name: str, package: Path = PACKAGE) -> str:
    """The layer of one of our modules, by its dotted name."""
    parts = name.split(".")[1:]
    if not parts:
        return TOP
    if parts[0] in PRODUCTS:
        is_folder = len(parts) > 1 and (package / parts[0] / parts[1]).is_dir()
        return f"{parts[0]}.{parts[1]}" if is_folder else parts[0]
    return parts[0]


def _layers_imported(path: Path, package: Path = PACKAGE) -> set[str]:
    """The layers of our own package that ``path`` imports."""
    return {_layer_of_module(name, package) for name in _imports(path)
            if name.split(".")[0] == "slurm_gpu_exporter"}


def _modules(package: Path = PACKAGE) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if p != package / "__init__.py")


def _wrong_imports(layer: str, rules: dict[str, set[str]], package: Path = PACKAGE
                   ) -> set[str]:
    """Each module of ``layer`` that imports a layer ``rules`` does not let it import."""
    return {
        f"{path.relative_to(package)} imports {sorted(extra)}"
        for path in _modules(package) if _layer_of(path, package) == layer
        if (extra := _layers_imported(path, package) - rules[layer] - {layer})
    }


def test_every_module_belongs_to_a_layer_with_rules() -> None:
    """A new folder (or top-level module) says in MAY_IMPORT which layers it sits on."""
    assert {_layer_of(p) for p in _modules()} <= set(MAY_IMPORT)


@pytest.mark.parametrize("layer", sorted(MAY_IMPORT))
def test_a_layer_imports_only_the_layers_it_sits_on(layer: str) -> None:
    assert _wrong_imports(layer, MAY_IMPORT) == set()


def test_a_broken_rule_is_found() -> None:
    """The check above fails when a layer imports past its rule: a rule taken away from
    the real table, and an upward import (top level and in a function) in a tree made
    for the test."""
    tighter = {**MAY_IMPORT, "report.prometheus": {"model", "report"}}
    assert "report/prometheus/queries.py imports ['report.figures']" in \
        _wrong_imports("report.prometheus", tighter)
    assert _wrong_imports("report.prometheus", MAY_IMPORT) == set()


def test_an_upward_import_in_a_made_tree_is_found(tmp_path: Path) -> None:
    package = tmp_path / "slurm_gpu_exporter"
    for folder in ("report/figures", "report/cli", "model", "node"):
        (package / folder).mkdir(parents=True)
    (package / "report/errors.py").write_text("")
    (package / "report/cli/main.py").write_text("")
    (package / "report/figures/shapes.py").write_text(
        "from slurm_gpu_exporter.report.errors import ReportError\n"
        "def late():\n    import slurm_gpu_exporter.report.cli.main\n")
    (package / "model/job.py").write_text("from slurm_gpu_exporter.node import procfs\n")
    assert _layer_of(package / "report/errors.py", package) == "report"
    assert _wrong_imports("report.figures", MAY_IMPORT, package) == {
        "report/figures/shapes.py imports ['report.cli']"}
    assert _wrong_imports("model", MAY_IMPORT, package) == {"model/job.py imports ['node']"}


def _module_graph() -> dict[str, set[str]]:
    """Each of our modules -> the modules of ours it imports (top level, in functions,
    under TYPE_CHECKING alike): ``from a import b`` counts as importing ``a.b`` when
    that is a module."""
    names = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
             for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        edges = set()
        for node in _import_nodes(path):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in names)
            elif node.module in names:
                subs = {f"{node.module}.{a.name}" for a in node.names} & set(names)
                edges.update(subs or {node.module})
        graph[name] = edges - {name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected parts of two or more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            part = []
            while (top := stack.pop()) != node:
                part.append(top)
            if part:
                circles.append(sorted([node, *part]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_no_modules_import_each_other() -> None:
    """No import circles, however long: a module's imports are always below it."""
    assert _circles(_module_graph()) == []


def test_an_import_circle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]


def _report_modules(layer: str | None = None) -> list[Path]:
    return [p for p in _modules() if _layer_of(p).startswith("report")
            if layer is None or _layer_of(p) == layer]


def test_only_the_archive_imports_the_database_libraries() -> None:
    """Reports, enforce and remediate run without SQLAlchemy or psycopg installed."""
    users = {path.relative_to(PACKAGE).as_posix() for path in _modules()
             for name in _imports(path) if name.split(".")[0] in ("sqlalchemy", "psycopg")}
    assert users and all(rel.startswith("report/archive/") for rel in users), users


# The only module outside the archive that loads it when it is itself loaded: the one
# that dispatches the archive's commands (archive, usage, --db).
ARCHIVE_LOADED_BY = {"report/cli/commands.py"}


def test_only_the_dispatch_of_archive_commands_loads_the_archive() -> None:
    loaders = {path.relative_to(PACKAGE).as_posix() for path in _modules()
               if _layer_of(path) != "report.archive"
               if any(name.startswith("slurm_gpu_exporter.report.archive")
                      for name in _top_level_imports(path))}
    assert loaders <= ARCHIVE_LOADED_BY


def test_only_the_slurm_layer_runs_commands_and_one_module_acts() -> None:
    """sacct is read in slurm/accounting, munge credentials made in slurm/munge;
    squeue, scancel and scontrol run only in slurm/actions (enforce and remediate act
    through it)."""
    runners = {path.relative_to(PACKAGE).as_posix() for path in _report_modules()
               if "subprocess" in _imports(path)}
    assert runners == {"report/slurm/accounting.py", "report/slurm/actions.py",
                       "report/slurm/munge.py"}
    acting = {path.relative_to(PACKAGE).as_posix() for path in _report_modules()
              for node in ast.walk(ast.parse(path.read_text()))
              if isinstance(node, ast.Constant) and node.value in ("scancel", "scontrol")}
    assert acting == {"report/slurm/actions.py"}


def test_job_figures_and_rendering_do_no_io() -> None:
    """What a job did and how it is shown: no network, no commands, no database."""
    io_modules = {"subprocess", "socket", "smtplib", "urllib", "aiohttp", "sqlalchemy",
                  "shutil", "ssl"}
    wrong = {f"{path.relative_to(PACKAGE)} imports {name}"
             for layer in ("report.figures", "report.render")
             for path in _report_modules(layer)
             for name in _imports(path) if name.split(".")[0] in io_modules}
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


# What the shared bottom layer may import: pure parts of the standard library.
MODEL_MAY_IMPORT = {"__future__", "collections.abc", "dataclasses", "functools", "re", "sys",
                    "typing", "urllib.parse"}


def test_the_shared_bottom_imports_only_pure_parts_of_the_standard_library() -> None:
    """model/ is what every product may import: no I/O, no third-party library."""
    wrong = {f"{path.relative_to(PACKAGE)} imports {name}"
             for path in (PACKAGE / "model").glob("*.py")
             for name in _imports(path)
             if name not in MODEL_MAY_IMPORT and not name.startswith("slurm_gpu_exporter.model")}
    assert wrong == set()


def test_exposition_and_web_sit_on_no_layer_that_does_io() -> None:
    for layer in ("exposition", "web"):
        assert MAY_IMPORT[layer] & IO_LAYERS == set()


# The web layer's one module of the agent's own: its exposition routes. Every other web
# module is what all servers stand on (the proxy and remediate too), so it imports no
# module of ours outside web/ but the package's version.
AGENT_WEB_MODULES = {"server.py"}


def _shared_web_imports_outside_web(package: Path = PACKAGE) -> set[str]:
    return {f"web/{path.name} imports {name}"
            for path in sorted((package / "web").glob("*.py"))
            if path.name not in AGENT_WEB_MODULES
            for name in _imports(path)
            if name.startswith("slurm_gpu_exporter.")
            and not name.startswith("slurm_gpu_exporter.web.")}


def test_the_shared_web_modules_import_nothing_of_the_agent() -> None:
    assert _shared_web_imports_outside_web() == set()


def test_an_agent_import_in_a_shared_web_module_is_found(tmp_path: Path) -> None:
    web = tmp_path / "slurm_gpu_exporter" / "web"
    web.mkdir(parents=True)
    (web / "listen.py").write_text("from slurm_gpu_exporter.web.config import WebConfig\n"
                                   "def late():\n"
                                   "    import slurm_gpu_exporter.exposition.rendered\n")
    (web / "server.py").write_text("import slurm_gpu_exporter.exposition.rendered\n")
    assert _shared_web_imports_outside_web(tmp_path / "slurm_gpu_exporter") == {
        "web/listen.py imports slurm_gpu_exporter.exposition.rendered"}


def _imported_package_modules(module: str) -> set[str]:
    """The package's modules loaded by importing ``module`` in a fresh interpreter."""
    code = (
        f"import sys, {module}\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('slurm_gpu_exporter')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.process
def test_report_commands_outside_the_archive_load_no_database_library() -> None:
    code = (
        "import sys\n"
        "import slurm_gpu_exporter.report.cli.flags, slurm_gpu_exporter.report.cli.reports\n"
        "import slurm_gpu_exporter.report.cli.remediate, slurm_gpu_exporter.report.enforce.run\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'psycopg')"
        " or m.startswith('slurm_gpu_exporter.report.archive')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.process
def test_the_web_layer_every_server_shares_loads_only_itself() -> None:
    """The proxy and remediate load the web layer's shared modules without any of the
    agent's (exposition, node readers)."""
    loaded = _imported_package_modules(", ".join(
        f"slurm_gpu_exporter.web.{p.stem}" for p in sorted((PACKAGE / "web").glob("*.py"))
        if p.name not in AGENT_WEB_MODULES and p.name != "__init__.py"))
    assert loaded and {m for m in loaded if m != "slurm_gpu_exporter"
                       and not m.startswith("slurm_gpu_exporter.web")} == set()


@pytest.mark.parametrize("module", ["slurm_gpu_exporter.exposition.snapshot",
                                    "slurm_gpu_exporter.exposition.metrics",
                                    "slurm_gpu_exporter.exposition.rendered",
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
        "print(sorted(m for m in sys.modules if m.startswith('slurm_gpu_exporter.')))\n"
        "print(sorted(sys.modules))"
    )
    # -S: without site-packages, anything beyond the stdlib fails to import.
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    third_party, ours, every = out.stdout.splitlines()
    assert third_party == "['slurm_gpu_exporter']"
    assert ours == ("['slurm_gpu_exporter.hooks', 'slurm_gpu_exporter.hooks.ids', "
                    "'slurm_gpu_exporter.hooks.jobhooks', 'slurm_gpu_exporter.hooks.recordjson', "
                    "'slurm_gpu_exporter.hooks.spool', 'slurm_gpu_exporter.model', "
                    "'slurm_gpu_exporter.model.ids']")
    # What a prolog's start would pay for (issue 37): json pulls in re, enum, functools
    # and collections; dataclasses pulls in inspect and ast.
    costly = {"re", "json", "dataclasses", "inspect", "ast", "enum", "functools",
              "collections", "typing"}
    assert costly & set(ast.literal_eval(every)) == set()


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


MAX_FOLDER_MODULES = 15


def _crowded_folders(package: Path = PACKAGE) -> list[str]:
    """Folders holding more modules than a reader takes in at once (their __init__ not
    counted): split them into subpackages by what the modules do."""
    crowded = []
    for folder in sorted({p.parent for p in package.rglob("*.py")}):
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        if len(modules) > MAX_FOLDER_MODULES:
            crowded.append(f"{folder.relative_to(package.parent)}: {len(modules)} modules")
    return crowded


def test_no_folder_holds_more_than_15_modules() -> None:
    assert _crowded_folders() == []


def test_a_crowded_folder_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "gpu").mkdir(parents=True)
    for i in range(MAX_FOLDER_MODULES + 1):
        (package / "gpu" / f"m{i}.py").write_text("")
    (package / "gpu" / "__init__.py").write_text("")
    assert _crowded_folders(package) == [f"pkg/gpu: {MAX_FOLDER_MODULES + 1} modules"]
    (package / "gpu" / "m0.py").unlink()
    assert _crowded_folders(package) == []
