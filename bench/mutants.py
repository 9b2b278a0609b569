"""Planted faults against the tests: does some test fail when the guarding code breaks?

Each fault of ``bench/mutants/faults.toml`` (an id, a file, its exact original text,
the text that replaces it, what the fault means) is planted, one at a time, in a copy
of the repository's tracked files in a temporary directory (the working tree is never
touched), and a test selection runs against it:

    .venv/bin/python bench/mutants.py                 # every fault, the fast tier
    .venv/bin/python bench/mutants.py --only enf-recheck-dropped --only rapl-wrap-equal
    .venv/bin/python bench/mutants.py --whole         # the process tests of each fault too
    .venv/bin/python bench/mutants.py --check         # every original found exactly once?
    .venv/bin/python bench/mutants.py --only ID --selection-only --no-write tests/x.py

A fault is *caught* when the selection fails, *survived* when it passes. The fast tier
(``-m "not process"``) runs first on a fault's own ``tests`` (quick for the usual
catch), then, where they all pass, on the whole fast tier, so "survived" means no test
of the tier fails. ``--whole`` then runs a survivor's ``whole`` selection (process tests
named in the list) under a venv of the copy (``overlay_venv``), so the console scripts
the tests start run the faulty code too. An original text that is not found exactly once is an
error: the list has to follow the code. The table goes to ``bench/mutants/RESULTS.md``
between the markers of the tag (``--tag before|after``), with the date, tier, counts
and each fault's time. Not run in CI: a run takes minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent / "mutants"
FAULTS = HERE / "faults.toml"
RESULTS = HERE / "RESULTS.md"
FAST = ["-m", "not process", "-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
        "--no-header", "-rfE"]
WHOLE = ["-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "--no-header", "-rfE"]


@dataclass(frozen=True)
class Fault:
    id: str
    file: str
    original: str
    replacement: str
    description: str
    tests: tuple[str, ...] = ()  # the fast tests to try first
    whole: tuple[str, ...] = ()  # process tests for --whole


@dataclass(frozen=True)
class Outcome:
    fault: Fault
    result: str  # caught, survived, error
    by: str  # the first failing test id, or why it is an error
    tier: str  # fast, whole
    seconds: float


def load_faults(path: Path = FAULTS) -> list[Fault]:
    """The faults of the list; SystemExit naming the entry when one is malformed."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    faults, seen = [], set()
    for n, raw in enumerate(data.get("fault", []), 1):
        try:
            fault = Fault(raw["id"], raw["file"], raw["original"], raw["replacement"],
                          raw["description"], tuple(raw.get("tests", ())),
                          tuple(raw.get("whole", ())))
        except (KeyError, TypeError) as exc:
            raise SystemExit(f"{path}: fault {n} lacks {exc}") from None
        if fault.id in seen:
            raise SystemExit(f"{path}: fault id {fault.id} is given twice")
        seen.add(fault.id)
        faults.append(fault)
    return faults


def check_fault(fault: Fault, root: Path) -> str | None:
    """Why ``fault`` cannot be planted in the tree at ``root``, or None."""
    try:
        text = (root / fault.file).read_text()
    except OSError as exc:
        return f"cannot read {fault.file}: {exc.strerror}"
    found = text.count(fault.original)
    if found != 1:
        return f"original text found {found} times in {fault.file} (must be exactly once)"
    if fault.original == fault.replacement:
        return "replacement equals the original"
    # A test file or folder moved away would leave the fault tried on nothing but the
    # whole tier (or, for --whole, on nothing at all).
    gone = [t for t in (*fault.tests, *fault.whole) if not (root / t.split("::")[0]).exists()]
    if gone:
        return f"no such test path: {', '.join(gone)}"
    return None


def copy_tree(dest: Path, ref: str | None = None) -> None:
    """The tracked files (as they are in the working tree, edits included) and the
    untracked ones git does not ignore, into ``dest``; with ``ref``, the files of that
    commit instead (to run the list against an earlier state of the tests)."""
    if ref is not None:
        archive = subprocess.run(["git", "archive", "--format=tar", ref], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if not (source.is_file() or source.is_symlink()):
            continue  # deleted in the working tree, or a submodule
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)


def overlay_venv(tree: Path) -> Path:
    """A venv whose Python imports the package from ``tree`` and everything else from
    this venv, with the console scripts of pyproject.toml: process tests start them
    with an environment of their own (no PYTHONPATH), so they must find the faulty
    copy by the interpreter they run. Its python."""
    venv = tree / ".venv-mutants"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    # Plain paths: the copy first; this venv's packages without its .pth files (its
    # editable install would point back at the working tree).
    here = [p for p in sys.path if p.endswith("site-packages")]
    (site / "00-mutants.pth").write_text("\n".join([str(tree), *here]) + "\n")
    with open(tree / "pyproject.toml", "rb") as f:
        scripts = tomllib.load(f).get("project", {}).get("scripts", {})
    for name, target in scripts.items():
        module, _, func = target.partition(":")
        script = venv / "bin" / name
        script.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\n"
                          f"from {module} import {func}\nsys.exit({func}())\n")
        script.chmod(0o755)
    return venv / "bin" / "python"


def first_failure(output: str) -> str:
    """The first failing test id pytest's short summary names (``FAILED id - …``)."""
    for line in output.splitlines():
        for word in ("FAILED ", "ERROR "):
            rest = line[len(word):]
            # captured log lines read "ERROR    logger:file.py:N …": not a test id
            if line.startswith(word) and not rest.startswith(" "):
                # a parameter id may hold " - " itself: take it to its closing bracket
                param = re.match(r"(\S+?\[.*?\])(?: - |$)", rest)
                return (param.group(1) if param else rest.split(" - ")[0]).strip()
    tail = [line for line in output.splitlines() if line.strip()]
    return tail[-1][:120] if tail else "no output"


def caught(code: int, by: str) -> bool:
    """A failed test, or a test module that no longer imports (a collection error)."""
    return code == 1 or (code == 2 and not by.startswith(("timed out", "no output")))


def run_pytest(tree: Path, options: list[str], selection: list[str], timeout: float,
               extra_env: dict[str, str], python: str = sys.executable) -> tuple[int, str]:
    """pytest in ``tree``; (exit status, first failure or last line)."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **extra_env}
    try:
        done = subprocess.run([python, "-m", "pytest", *options, *selection],
                              cwd=tree, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:g} s"
    return done.returncode, first_failure(done.stdout + done.stderr)


def try_fault(fault: Fault, tree: Path, args: argparse.Namespace) -> Outcome:
    """Plant ``fault`` in ``tree``, run the tests, take it out again."""
    started = time.monotonic()
    problem = check_fault(fault, tree)
    if problem is not None:
        return Outcome(fault, "error", problem, "-", 0.0)
    path = tree / fault.file
    clean = path.read_text()
    path.write_text(clean.replace(fault.original, fault.replacement))
    try:
        fast = [*FAST, *(["-n", str(args.workers)] if args.workers else [])]
        # A hint the tree lacks (an older --ref) is left out, not an error.
        present = [t for t in fault.tests if (tree / t.split("::")[0]).exists()]
        hints = [present] if present and not args.selection_only else []
        selections = [*hints, list(args.selection)]
        for selection in selections:
            code, by = run_pytest(tree, fast, selection, args.timeout, {})
            if caught(code, by):
                return Outcome(fault, "caught", by, "fast", time.monotonic() - started)
            if code not in (0, 5):  # 5: nothing selected
                return Outcome(fault, "error", f"pytest exit {code}: {by}", "fast",
                               time.monotonic() - started)
        if args.whole and fault.whole:
            code, by = run_pytest(tree, WHOLE, list(fault.whole), args.timeout,
                                  {"PYTHONPATH": str(tree), "CI": "true"},
                                  str(tree / ".venv-mutants" / "bin" / "python"))
            if caught(code, by):
                return Outcome(fault, "caught", by, "whole", time.monotonic() - started)
            if code not in (0, 5):
                return Outcome(fault, "error", f"pytest exit {code}: {by}", "whole",
                               time.monotonic() - started)
        return Outcome(fault, "survived", "", "whole" if args.whole and fault.whole
                       else "fast", time.monotonic() - started)
    finally:
        path.write_text(clean)


def table(outcomes: list[Outcome], tag: str, args: argparse.Namespace, commit: str) -> str:
    """The markdown section for one run."""
    counts = {r: sum(1 for o in outcomes if o.result == r)
              for r in ("caught", "survived", "error")}
    tier = "fast tier (-m 'not process')" + (" + each fault's process tests" if args.whole
                                              else "")
    lines = [f"<!-- mutants:{tag}:begin -->",
             f"### {tag}: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {commit}",
             "",
             f"Tier: {tier}. {len(outcomes)} faults: {counts['caught']} caught, "
             f"{counts['survived']} survived, {counts['error']} errors. "
             f"Total {sum(o.seconds for o in outcomes):.0f} s.",
             "",
             "| fault | file | result | first failing test | tier | s |",
             "|---|---|---|---|---|---|"]
    for o in outcomes:
        by = (o.by if len(o.by) <= 120 else o.by[:117] + "...").replace("|", "\\|")
        lines.append(f"| `{o.fault.id}` | {o.fault.file.removeprefix('slurm_gpu_exporter/')}"
                     f" | **{o.result}** | {by or '-'} | {o.tier} | {o.seconds:.1f} |")
    lines.append(f"<!-- mutants:{tag}:end -->")
    return "\n".join(lines) + "\n"


def write_results(section: str, tag: str, path: Path = RESULTS) -> None:
    """Replace the tag's section of RESULTS.md (or append it)."""
    text = path.read_text() if path.exists() else "# Planted faults: results\n\n"
    begin, end = f"<!-- mutants:{tag}:begin -->", f"<!-- mutants:{tag}:end -->"
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        text = head + section.rstrip("\n") + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="ID",
                        help="run only this fault (repeatable)")
    parser.add_argument("--whole", action="store_true",
                        help="also run each survivor's process tests (its `whole` list)")
    parser.add_argument("--check", action="store_true",
                        help="only check that every original text is found exactly once "
                             "and every test path it names is there")
    parser.add_argument("--tag", default="latest", help="the RESULTS.md section to write")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument("--workers", type=int, default=0,
                        help="pytest-xdist workers for the fast tier (0: none)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds one pytest run may take")
    parser.add_argument("--selection-only", action="store_true",
                        help="run only the given selection, not each fault's own tests first "
                             "(to see whether a new test file catches a fault)")
    parser.add_argument("--ref", metavar="COMMIT",
                        help="run against the files of COMMIT instead of the working tree")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the run of the fast tier without a fault first")
    parser.add_argument("selection", nargs="*", default=["tests"],
                        help="the fast tier's test paths (default: tests)")
    args = parser.parse_args(argv)
    faults = load_faults()
    if args.only:
        unknown = set(args.only) - {f.id for f in faults}
        if unknown:
            parser.error(f"no fault named {', '.join(sorted(unknown))}")
        faults = [f for f in faults if f.id in args.only]
    if args.check:
        bad = [(f.id, p) for f in faults if (p := check_fault(f, ROOT)) is not None]
        for fid, problem in bad:
            print(f"{fid}: {problem}")
        print(f"{len(faults) - len(bad)} of {len(faults)} faults can be planted")
        return 1 if bad else 0
    commit = subprocess.run(["git", "rev-parse", "--short", args.ref or "HEAD"], cwd=ROOT,
                            capture_output=True, text=True, check=False).stdout.strip()
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        tree = Path(tmp)
        copy_tree(tree, args.ref)
        if args.whole:
            overlay_venv(tree)
        if not args.no_baseline:  # a tier that fails anyway would "catch" every fault
            started = time.monotonic()
            code, by = run_pytest(tree, FAST, list(args.selection), args.timeout, {})
            print(f"baseline {time.monotonic() - started:.0f} s: pytest exit {code}", flush=True)
            if code != 0:
                print(f"the fast tier fails without a fault ({by}); fix that first",
                      file=sys.stderr)
                return 2
        for fault in faults:
            outcome = try_fault(fault, tree, args)
            outcomes.append(outcome)
            print(f"{outcome.result:8} {fault.id:32} {outcome.seconds:6.1f} s  {outcome.by[:200]}",
                  flush=True)
    section = table(outcomes, args.tag, args, commit)
    print(section)
    if not args.no_write:
        write_results(section, args.tag)
    return 2 if any(o.result == "error" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
