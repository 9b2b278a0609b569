"""The examples are not imported (torch is no dependency); they must at least compile."""

from __future__ import annotations

import py_compile

import pytest

from tests.support import REPO

EXAMPLES = sorted((REPO / "examples").glob("*.py"))


def test_there_are_examples():
    assert {p.name for p in EXAMPLES} >= {"pytorch_train.py", "lightning_callback.py"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_compiles(path, tmp_path):
    py_compile.compile(str(path), cfile=str(tmp_path / "out.pyc"), doraise=True)
