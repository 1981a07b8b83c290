"""The lessons are authored as jupytext py:percent files (lessons/NN_name.py) and committed as
paired notebooks (lessons/NN_name.ipynb) with outputs stripped. These tests keep the two in step:

    jupytext --to ipynb lessons/NN_name.py      # after editing the .py
    jupytext --sync lessons/NN_name.py          # or keep both paired
"""
import glob
import json
import os

import pytest

jupytext = pytest.importorskip("jupytext")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LESSONS = os.path.join(ROOT, "lessons")
PY = sorted(glob.glob(os.path.join(LESSONS, "*.py")))
IPYNB = sorted(glob.glob(os.path.join(LESSONS, "*.ipynb")))


def _cells(nb):
    return [(c["cell_type"], c["source"] if isinstance(c["source"], str) else "".join(c["source"]))
            for c in nb["cells"]]


def test_there_are_lessons():
    assert len(PY) >= 8, f"expected the lessons 00..07 in {LESSONS}, found {[os.path.basename(p) for p in PY]}"


@pytest.mark.parametrize("py", PY, ids=os.path.basename)
def test_py_has_matching_notebook_with_same_cells(py):
    ipynb = py[:-3] + ".ipynb"
    assert os.path.exists(ipynb), f"{os.path.basename(py)} has no notebook: run `jupytext --to ipynb {os.path.relpath(py, ROOT)}`"
    from_py = jupytext.read(py)
    with open(ipynb, encoding="utf-8") as fh:
        nb = json.load(fh)
    a, b = _cells(from_py), _cells(nb)
    assert len(a) == len(b), (f"{os.path.basename(ipynb)} has {len(b)} cells, the .py {len(a)}: "
                              f"run `jupytext --to ipynb {os.path.relpath(py, ROOT)}`")
    for i, (x, y) in enumerate(zip(a, b)):
        assert x == y, f"cell {i} of {os.path.basename(ipynb)} differs from the .py: regenerate the notebook"


@pytest.mark.parametrize("ipynb", IPYNB, ids=os.path.basename)
def test_notebook_has_source_and_no_outputs(ipynb):
    assert os.path.exists(ipynb[:-6] + ".py"), f"{os.path.basename(ipynb)} has no .py source"
    with open(ipynb, encoding="utf-8") as fh:
        nb = json.load(fh)
    for i, c in enumerate(nb["cells"]):
        if c["cell_type"] != "code":
            continue
        assert not c.get("outputs"), f"cell {i} of {os.path.basename(ipynb)} has stored outputs: strip them"
        assert c.get("execution_count") is None, f"cell {i} of {os.path.basename(ipynb)} has an execution count"
