"""The notebooks in examples/notebooks/ are kept without outputs (git holds code, not a run's results), each
has one `parameters` cell (what the image tier's run replaces: tests/images/test_notebooks.py), and their
code compiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.notebooks import NOTEBOOKS, notebook_program

PAGES = sorted(NOTEBOOKS.glob("*.ipynb"))


def test_there_are_notebooks_for_both_sdks() -> None:
    assert [p.name for p in PAGES] == ["mnist_sdk_v2.ipynb", "mnist_sdk_v3.ipynb"]


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_a_notebook_is_stripped_and_has_one_parameters_cell(path: Path) -> None:
    book = json.loads(path.read_text())
    code = [cell for cell in book["cells"] if cell["cell_type"] == "code"]
    assert [(cell["outputs"], cell["execution_count"]) for cell in code] == [([], None)] * len(code)
    tagged = [cell for cell in code if "parameters" in cell["metadata"].get("tags", [])]
    assert len(tagged) == 1
    compile(notebook_program(path, {"IMAGE": "x"}), str(path), "exec")
