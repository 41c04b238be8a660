"""The layering of tpcomm/: LAYERS (tpcomm/experiments/report/layout.py, the table
docs/layout.md draws) orders the subpackages and the two model files; every import of the package (inside
functions too) goes from a row to a lower one, so the subpackages' import graph has no cycle; a wrong-way
import planted in a copy of the sources is found. And docs/layout.md, generated from the modules' docstrings,
is current; the README's Layout points to it in at most 15 lines."""

import os
import re

import pytest

from conftest import ROOT
from test_house import import_cycle
from tpcomm.experiments.report import report
from tpcomm.experiments.report.layout import (LAYERS, LEVEL, first_sentence, imports_of, layered_sources,
                                              layout_page, unit_of, wrong_way_imports)


@pytest.fixture(scope="module")
def sources():
    return layered_sources()


def test_every_import_goes_down_the_layers(sources):
    assert len(sources) > 60 and "tpcomm/tp/collectives.py" in sources  # the package was read, subfolders too
    assert wrong_way_imports(sources) == []


def test_every_unit_of_the_package_is_in_the_table(sources):
    """Each subpackage (and the root, and the two model files) has a row: a new subpackage needs a place."""
    units = {unit_of(name[:-3].replace("/", ".").removesuffix(".__init__")) for name in sources}
    assert units == set(LEVEL)
    assert len(LEVEL) == sum(map(len, LAYERS))  # no unit on two rows


def test_the_units_import_graph_has_no_cycle(sources):
    """Read from the imports themselves, not from LAYERS: unit -> the units it imports, searched for a cycle
    (the module-level detector of test_house.py)."""
    graph = {unit: set() for unit in LEVEL}
    for path, source in sources.items():
        here = unit_of(path[:-3].replace("/", ".").removesuffix(".__init__"))
        module = path[:-3].replace("/", ".").removesuffix(".__init__")
        graph[here] |= {u for _, name in imports_of(source, module, path.endswith("__init__.py"))
                        for u in [unit_of(name)] if u in graph and u != here}
    assert sum(map(len, graph.values())) > 30  # the imports were read
    assert import_cycle(graph) is None
    assert set(import_cycle(dict(graph, tp=graph["tp"] | {"train"}))) >= {"tp", "train"}  # one planted: found


@pytest.mark.parametrize("path, line, why", [
    ("tpcomm/tp/collectives.py", "from tpcomm.train.runtime import seed_everything", "a higher row"),
    ("tpcomm/tp/collectives.py", "def f():\n    import tensor_parallel_model", "a higher row"),
    ("tpcomm/costmodel/cost_model.py", "from tpcomm.figures import png", "the same row"),
    ("tpcomm/model/options.py", "from tpcomm.experiments.report import answer", "a higher row"),
    ("tpcomm/experiments/sweep.py", "from .report.answer import answer_table", "a higher row"),
    ("tpcomm/experiments/__init__.py", "from . import report", "a higher row"),
    ("model.py", "from tpcomm.tp import collectives", "a higher row"),
    ("tpcomm/train/build.py", "import train", "an entry script"),
    ("tpcomm/train/checkpoint.py", "from bench import main", "an entry script"),
])
def test_a_planted_wrong_way_import_is_found(sources, path, line, why):
    """Anti-vacuity: the check above fails on a copy of a module's source with one import against LAYERS added
    (at the top, or inside a function; absolute or relative); the copy without it passes."""
    assert wrong_way_imports({path: sources[path]}) == []
    found = wrong_way_imports({path: sources[path] + "\n" + line + "\n"})
    assert len(found) == 1 and found[0].startswith(f"{path}:") and why in found[0], found


def test_docs_layout_is_generated_from_the_docstrings(sources):
    """docs/layout.md's generated block is what `python experiment.py report` writes now (report --check
    compares the same), and it names every module once."""
    assert "layout" in report.blocks()
    with open(os.path.join(ROOT, "docs", "layout.md"), encoding="utf-8") as f:
        text = f.read()
    block = re.search(r"<!-- report:layout -->\n(.*)\n<!-- /report:layout -->", text, re.S)
    stale = "docs/layout.md is stale: python experiment.py report"
    assert block and block.group(1) == layout_page().strip(), stale
    for path in sources:
        if not path.endswith("__init__.py"):
            assert text.count(f"[`{path}`]") == 1, path


def test_first_sentence():
    assert first_sentence("One. Two.") == "One."
    assert first_sentence("A plan, e.g. this one, spans\nlines. Then "
                          "more.") == "A plan, e.g. this one, spans lines."
    assert first_sentence("Only a paragraph\n\nand another.") == "Only a paragraph"


def test_the_readme_layout_is_short_and_points_to_docs_layout():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    start = lines.index("## Layout")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    section = lines[start + 1:end]
    assert len(section) <= 15, len(section)
    assert any("docs/layout.md" in line for line in section)


def test_docs_tests_md_maps_every_test_file():
    """docs/tests.md's table from each feature to its test files names every test file under tests/,
    and only files that exist."""
    with open(os.path.join(ROOT, "docs", "tests.md"), encoding="utf-8") as f:
        text = f.read()
    table = text.split("## Where each feature is tested", 1)[1].split("\n## ", 1)[0]
    named = {p for row in table.splitlines() if row.startswith("| ")
             for p in re.findall(r"tests/[\w/]+\.py", row)}
    on_disk = {os.path.relpath(os.path.join(d, f), ROOT) for d, _, files in os.walk(os.path.join(ROOT,
                                                                                                 "tests"))
               for f in files if f.startswith("test_") and f.endswith(".py")}
    assert len(on_disk) > 50
    assert sorted(on_disk - named) == [], "test files docs/tests.md's table does not name"
    assert sorted(named - on_disk) == [], "files docs/tests.md's table names that do not exist"
