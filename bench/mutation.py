"""Mutation score of the fast tier, by mutmut, in the modules that decide what is acted on,
written where and read by users: a seeded sample of mutants per module group.

    nice -n 19 .venv/bin/python bench/mutation.py                   # every group, 40 each
    nice -n 19 .venv/bin/python bench/mutation.py --group mail --sample 20 --seed 7
    nice -n 19 .venv/bin/python bench/mutation.py --list             # the groups

Each group runs in a scratch copy of the tree (the tracked files and the untracked ones git
does not ignore, as ``bench/mutants.py`` copies them) under ``--work`` (default
/var/tmp/mutation-work/<group>), with a ``setup.cfg`` of its own that tells mutmut 3 to
mutate only that group's files and to run the fast tier of that area's tests
(``pytest -m "not process" -x -q -p no:cacheprovider tests/<area>``): mutmut's
``mutants/`` folder is made there, never in the checkout. mutmut generates every mutant of
the group, runs the tests once to learn which test reaches which function, then this
script draws ``--sample`` of the mutant names with ``random.Random(seed)`` and has mutmut
run those alone (``mutmut run NAME...``, one worker). A mutant is *killed* when a test
fails, *survived* when every test that reaches its function passes, *no tests* when no
test of the selection reaches it. A full run of every mutant does not fit a bench run on
the 2-core machine (thousands of mutants, each a pytest run): the figures are a sample.

Results go to ``results/mutation_issue55.json`` (groups not run this time keep their last
figures), with each survivor's diff. Not run in CI: a group takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import common
from common import RESULTS

ROOT = Path(__file__).resolve().parent.parent
NAME = "mutation_issue55"
MUTMUT = Path(sys.executable).parent / "mutmut"
# A name no mutant has: `mutmut run` with it generates the mutants and collects the
# stats (which test reaches which function), then stops on "nothing matches".
NO_MUTANT = "__no_such_mutant__"
# pytest's options besides the test paths; mutmut adds -x -q itself.
FAST = ["-m", "not process", "-p", "no:cacheprovider"]


@dataclass(frozen=True)
class Group:
    name: str
    mutate: tuple[str, ...]  # mutmut's only_mutate globs
    tests: tuple[str, ...]  # the area's test folders


GROUPS = (
    Group("report/mlflow", ("slurm_gpu_exporter/report/mlflow/*",), ("tests/report/mlflow",)),
    Group("mail", ("slurm_gpu_exporter/mail/*",), ("tests/mail",)),
    Group("report/render", ("slurm_gpu_exporter/report/render/*",
                            "slurm_gpu_exporter/report/inert_text.py"),
          ("tests/report/render",)),
    Group("report/enforce", ("slurm_gpu_exporter/report/enforce/*",),
          ("tests/report/enforce",)),
    Group("report/remediate", ("slurm_gpu_exporter/report/remediate/*",),
          ("tests/report/remediate",)),
    Group("gpu/attribution", ("slurm_gpu_exporter/gpu/attribution/*",), ("tests/gpu",)),
    Group("proxy", ("slurm_gpu_exporter/proxy/*",), ("tests/proxy",)),
)


def copy_tree(dest: Path) -> None:
    """The tracked files (working-tree contents) and the untracked ones git does not
    ignore, into ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if name.startswith("mutants/") or not (source.is_file() or source.is_symlink()):
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)


def write_config(tree: Path, group: Group) -> None:
    """mutmut's section of a setup.cfg in the copy (pyproject.toml has none, so mutmut
    reads this one); every other top-level entry is copied beside the mutated package,
    for tests that read fixtures, deploy files or docs."""
    also = sorted(p.name for p in tree.iterdir()
                  if p.name not in {"slurm_gpu_exporter", "mutants", "setup.cfg"})

    def lines(values: list[str] | tuple[str, ...]) -> str:
        return "".join(f"\n    {v}" for v in values)

    (tree / "setup.cfg").write_text(
        "[mutmut]\n"
        "source_paths = slurm_gpu_exporter\n"
        f"only_mutate ={lines(group.mutate)}\n"
        f"also_copy ={lines(also)}\n"
        f"pytest_add_cli_args ={lines(FAST)}\n"
        f"pytest_add_cli_args_test_selection ={lines(group.tests)}\n")


def mutmut(tree: Path, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(MUTMUT), *args], cwd=tree, capture_output=True, text=True,
                          timeout=timeout, check=False)


def statuses(tree: Path) -> dict[str, str]:
    """Every mutant of the group and its status, from ``mutmut results --all true``."""
    done = mutmut(tree, ["results", "--all", "true"], 600)
    found = {}
    for line in done.stdout.splitlines():
        match = re.match(r"\s+(\S+): (.+)$", line)
        if match:
            found[match.group(1)] = match.group(2).strip()
    return found


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def sample_of(every: dict[str, str], args: argparse.Namespace) -> list[str]:
    """The seeded sample of the group's mutant names (the same names for the same
    mutants, seed and size)."""
    return sorted(random.Random(args.seed).sample(sorted(every), min(args.sample, len(every))))


def run_group(group: Group, args: argparse.Namespace) -> dict[str, object]:
    """Generate, sample and run the group's mutants (with ``--collect``, only read what
    a kept scratch copy holds); its figures."""
    started = time.monotonic()
    tree = args.work / group.name.replace("/", "-")
    if args.collect:
        if not (tree / "mutants").is_dir():
            return {"error": f"no kept scratch copy at {tree}"}
        every = statuses(tree)
        chosen = sample_of(every, args)
    else:
        if tree.exists():
            shutil.rmtree(tree)
        tree.mkdir(parents=True)
        copy_tree(tree)
        write_config(tree, group)
        print(f"[{group.name}] generating mutants and collecting stats in {tree}", flush=True)
        first = mutmut(tree, ["run", "--max-children", "1", NO_MUTANT], args.timeout)
        if "nothing matches" not in first.stdout + first.stderr:
            return {"error": "mutmut did not get to its mutants: "
                             + tail(first.stdout + first.stderr)}
        every = statuses(tree)
        if not every:
            return {"error": "mutmut listed no mutants"}
        chosen = sample_of(every, args)
        print(f"[{group.name}] {len(every)} mutants; running {len(chosen)} "
              f"({time.monotonic() - started:.0f} s so far)", flush=True)
        second = mutmut(tree, ["run", "--max-children", "1", *chosen], args.timeout)
        if all(statuses(tree).get(n, "not checked") == "not checked" for n in chosen):
            return {"error": "mutmut ran none of the sample: "
                             + tail(second.stdout + second.stderr)}
    after = statuses(tree)
    result = {name: after.get(name, "missing") for name in chosen}
    counts: dict[str, int] = {}
    for status in result.values():
        counts[status] = counts.get(status, 0) + 1
    killed = counts.get("killed", 0) + counts.get("caught by type check", 0)
    survived = counts.get("survived", 0)
    no_tests = counts.get("no tests", 0)
    unrun = counts.get("not checked", 0) + counts.get("missing", 0)
    other = len(chosen) - killed - survived - no_tests - unrun
    survivors = {}
    for name, status in result.items():
        if status in ("survived", "no tests"):
            diff = mutmut(tree, ["show", name], 120).stdout
            survivors[name] = {"status": status, "diff": diff.strip()}
    if not args.keep and not args.collect:
        shutil.rmtree(tree)
    run = len(chosen) - unrun
    return {
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "mutate": list(group.mutate), "tests": list(group.tests),
        "command": "pytest " + " ".join(["-m", "'not process'", "-x", "-q", "-p",
                                         "no:cacheprovider", *group.tests]),
        "mutants": len(every), "seed": args.seed, "sample": len(chosen),
        "not_run": unrun,  # a run stopped part way: these were drawn but not run
        "killed": killed, "survived": survived, "no_tests": no_tests,
        "timeout_suspicious_other": other,
        "killed_share": round(killed / run, 3) if run else None,
        "statuses": result, "survivors": survivors,
        "seconds": round(time.monotonic() - started),
    }


def table(groups: dict[str, dict[str, object]]) -> str:
    """The markdown table of the groups' figures."""
    lines = ["| group | mutants | sampled | run | killed | survived | no tests | timeout/other "
             "| killed share | seed | date |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, g in groups.items():
        if "error" in g:
            lines.append(f"| {name} | error: {str(g['error']).splitlines()[-1][:80]} "
                         "| | | | | | | | | |")
            continue
        run = int(g["sample"]) - int(g.get("not_run", 0))
        share = "-" if g["killed_share"] is None else f"{g['killed_share']:.0%}"
        lines.append(f"| {name} | {g['mutants']} | {g['sample']} | {run} | {g['killed']} | "
                     f"{g['survived']} | {g['no_tests']} | {g['timeout_suspicious_other']} | "
                     f"{share} | {g['seed']} | {str(g['when'])[:10]} |")
    return "\n".join(lines)


def write_results(groups: dict[str, dict[str, object]]) -> None:
    """results/mutation_issue55.json, with the machine and the yardstick as
    ``common.record`` keeps them (its printing of every figure left out: the groups hold
    every mutant's status and each survivor's diff)."""
    data = {
        "benchmark": NAME,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {platform.python_implementation()} "
                   f"{platform.python_version()}, {os.cpu_count()} CPUs",
        "yardstick": {"start": common._AT_START, "end": common.yardstick()},
        "tool": "mutmut 3, the fast tier (-m 'not process') of each area's tests",
        "note": "a seeded sample of each group's mutants, not every mutant",
        "groups": groups,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{NAME}.json").write_text(json.dumps(data, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", action="append", default=[],
                        help="run only this group (repeatable); see --list")
    parser.add_argument("--list", action="store_true", help="list the groups and stop")
    parser.add_argument("--sample", type=int, default=40,
                        help="mutants drawn per group (default 40)")
    parser.add_argument("--seed", type=int, default=55, help="the sample's seed")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds one mutmut step may take")
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/mutation-work"),
                        help="where the scratch copies go (never the checkout)")
    parser.add_argument("--collect", action="store_true",
                        help="run nothing: read the figures of the groups' kept scratch "
                             "copies (--keep) again, e.g. after a run stopped part way")
    parser.add_argument("--keep", action="store_true",
                        help="keep each group's scratch copy (for `mutmut show` after)")
    args = parser.parse_args(argv)
    if args.list:
        for g in GROUPS:
            print(f"{g.name:20} {' '.join(g.mutate)}  <- {' '.join(g.tests)}")
        return 0
    if args.work.resolve().is_relative_to(ROOT):
        parser.error("--work must lie outside the checkout")
    if not MUTMUT.exists():
        parser.error(f"no {MUTMUT}: pip install -e '.[bench]' (mutmut 3)")
    unknown = set(args.group) - {g.name for g in GROUPS}
    if unknown:
        parser.error(f"no group named {', '.join(sorted(unknown))}")
    chosen = [g for g in GROUPS if not args.group or g.name in args.group]
    print("A sample: a full run of every mutant does not fit a bench run "
          f"(at most {args.sample} mutants per group, seed {args.seed}).", flush=True)
    old = RESULTS / f"{NAME}.json"
    groups = json.loads(old.read_text()).get("groups", {}) if old.exists() else {}
    for group in chosen:
        figures = run_group(group, args)
        groups[group.name] = figures
        if "error" in figures:
            print(f"[{group.name}] error: {figures['error']}", flush=True)
        else:
            print(f"[{group.name}] sampled {figures['sample']} of {figures['mutants']}: "
                  f"killed {figures['killed']}, survived {figures['survived']}, "
                  f"no tests {figures['no_tests']}, timeout/suspicious "
                  f"{figures['timeout_suspicious_other']}, not run {figures['not_run']}, "
                  f"killed share {figures['killed_share']} ({figures['seconds']} s)",
                  flush=True)
        write_results(groups)  # a run stopped part way keeps the groups it finished
    order = [g.name for g in GROUPS]
    groups = dict(sorted(groups.items(), key=lambda kv: order.index(kv[0])
                         if kv[0] in order else len(order)))
    summary = table(groups)
    write_results(groups)
    print(summary)
    return 1 if any("error" in groups[g.name] for g in chosen) else 0


if __name__ == "__main__":
    sys.exit(main())
