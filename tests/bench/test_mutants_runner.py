"""The planted-fault runner's pure parts (bench/mutants.py): reading the list, a fault
whose original text is not found exactly once, the first failing test of pytest's
summary, and its results section rewritten in place."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import REPO

BENCH = REPO / "bench" / "mutants.py"


@pytest.fixture(scope="module")
def mutants() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_mutants", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_mutants"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_list_reads_and_each_id_is_unique(mutants: ModuleType, tmp_path: Path) -> None:
    faults = mutants.load_faults()
    assert len(faults) >= 25 and len({f.id for f in faults}) == len(faults)
    twice = tmp_path / "faults.toml"
    twice.write_text('[[fault]]\nid = "a"\nfile = "f"\noriginal = "x"\nreplacement = "y"\n'
                     'description = "d"\n' * 2)
    with pytest.raises(SystemExit, match="given twice"):
        mutants.load_faults(twice)
    twice.write_text('[[fault]]\nid = "a"\nfile = "f"\n')
    with pytest.raises(SystemExit, match="lacks 'original'"):
        mutants.load_faults(twice)


def test_an_original_not_found_exactly_once_is_an_error(mutants: ModuleType,
                                                        tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("a = 1\nb = 1\n")

    def fault(original: str, replacement: str = "z") -> object:
        return mutants.Fault("id", "m.py", original, replacement, "d")

    assert mutants.check_fault(fault("a = 1"), tmp_path) is None
    assert "found 2 times" in mutants.check_fault(fault(" = 1"), tmp_path)
    assert "found 0 times" in mutants.check_fault(fault("c = 1"), tmp_path)
    assert "equals" in mutants.check_fault(fault("a = 1", "a = 1"), tmp_path)
    assert "cannot read" in mutants.check_fault(
        mutants.Fault("id", "gone.py", "a", "b", "d"), tmp_path)


def test_a_test_path_the_list_names_that_is_not_there_is_an_error(
        mutants: ModuleType, tmp_path: Path) -> None:
    """Tests moved to another folder leave no fault tried on nothing."""
    (tmp_path / "m.py").write_text("a = 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("")
    named = mutants.Fault("id", "m.py", "a = 1", "z", "d", ("tests/t.py::test_x", "tests"),
                          ("tests/t.py",))
    assert mutants.check_fault(named, tmp_path) is None
    moved = mutants.Fault("id", "m.py", "a = 1", "z", "d", ("tests/unit",),
                          ("tests/integration/t.py",))
    assert mutants.check_fault(moved, tmp_path) == (
        "no such test path: tests/unit, tests/integration/t.py")


def test_the_first_failing_test_is_read_from_the_short_summary(mutants: ModuleType) -> None:
    out = ("....F\n=== short test summary info ===\n"
           "FAILED tests/x.py::test_a[p - q] - AssertionError: no\n"
           "FAILED tests/x.py::test_b - AssertionError\n!!! stopping after 1 failures !!!\n")
    assert mutants.first_failure(out) == "tests/x.py::test_a[p - q]"
    assert mutants.first_failure("ERROR tests/y.py - ImportError\n") == "tests/y.py"
    assert mutants.caught(1, "tests/x.py::test_a")
    assert mutants.caught(2, "tests/y.py") and not mutants.caught(2, "timed out after 9 s")
    assert not mutants.caught(0, "") and not mutants.caught(5, "")


def test_a_results_section_is_replaced_in_place(mutants: ModuleType, tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# R\n\nprose\n")
    mutants.write_results("<!-- mutants:before:begin -->\nold\n<!-- mutants:before:end -->\n",
                          "before", results)
    mutants.write_results("<!-- mutants:after:begin -->\nA\n<!-- mutants:after:end -->\n",
                          "after", results)
    mutants.write_results("<!-- mutants:before:begin -->\nnew\n<!-- mutants:before:end -->\n",
                          "before", results)
    text = results.read_text()
    assert text.startswith("# R\n\nprose\n") and "old" not in text
    assert text.index("new") < text.index("A")  # kept in its place
