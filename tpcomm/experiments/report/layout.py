"""docs/layout.md, generated from the modules' own docstrings: the layering of tpcomm/ (LAYERS, the one table
of which subpackage may import which) drawn as one diagram, then every module with the first sentence of its
docstring, grouped by subpackage under the subpackage's own docstring. `python experiment.py report` writes it
(report.py's blocks(): `layout`), `report --check` fails when it is stale; tests/house/test_layering.py checks
every import of the package against LAYERS."""

import ast
import glob
import os
import re

from tpcomm import ROOT

# The layering, low to high: a module imports only from rows below its own (never from its own row's other
# units, never upward); the entry scripts (train.py, bench.py, ...) sit above every row and nothing here
# imports them. A unit is a subpackage of tpcomm/ (all its modules, its subfolders too, except
# experiments/report, a unit of its own), the package root tpcomm/__init__.py ("tpcomm": ROOT), or one of the
# two top-level model files.
LAYERS = (
    ("model.py", "tpcomm"),
    ("tp",),
    ("model",),
    ("tensor_parallel_model.py",),
    ("parallel",),
    ("train",),
    ("experiments/ways",),  # the table of ways: what the experiments train and the cost model prices
    ("costmodel", "figures"),
    ("convert", "bench"),
    ("gpu",),
    ("experiments",),
    ("experiments/report",),
)
TOP_LEVEL_UNITS = {"model": "model.py", "tensor_parallel_model": "tensor_parallel_model.py"}
LEVEL = {unit: i for i, row in enumerate(LAYERS) for unit in row}


def unit_of(module, root=ROOT):
    """The LAYERS unit of a dotted module name ('tpcomm.tp.compress.compression' -> 'tp'); 'script' for
    another top-level module of the repository (an entry script); None for anything outside the repository."""
    parts = module.split(".")
    if parts[0] in TOP_LEVEL_UNITS:
        return TOP_LEVEL_UNITS[parts[0]]
    if parts[0] != "tpcomm":  # `from train import main` imports the script train.py
        return "script" if os.path.isfile(os.path.join(root, f"{parts[0]}.py")) else None
    if parts[1:3] == ["experiments", "report"]:
        return "experiments/report"
    if parts[1:3] == ["experiments", "ways"]:
        return "experiments/ways"
    if len(parts) > 1 and os.path.isdir(os.path.join(root, "tpcomm", parts[1])):
        return parts[1]
    return "tpcomm"


def module_name(path, root=ROOT):
    """'tpcomm/tp/collectives.py' -> 'tpcomm.tp.collectives'; a package's __init__.py is the package."""
    name = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


def imports_of(source, module, is_package=False):
    """(line, imported module) of every import in a module's source, at any depth (inside functions too); for
    `from a.b import c` the name is 'a.b.c' (c may be a module); relative imports resolved against `module` (a
    package when is_package: its __init__.py)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") + ([""] if is_package else [])
                package = parts[:len(parts) - node.level]
                base = ".".join(package + ([base] if base else []))
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return found


def layered_sources(root=ROOT):
    """{path relative to root: source} of every module LAYERS orders:
    tpcomm/**/*.py and the two model files."""
    paths = sorted(glob.glob(os.path.join(root, "tpcomm", "**", "*.py"), recursive=True))
    paths += [os.path.join(root, f) for f in TOP_LEVEL_UNITS.values()]
    return {os.path.relpath(p, root): open(p, encoding="utf-8").read() for p in paths}


def wrong_way_imports(sources, root=ROOT):
    """One line per import against LAYERS in {path: source}: a unit importing its own row's other units, a
    higher row, an entry script, or a unit LAYERS does not list."""
    problems = []
    for path, source in sorted(sources.items()):
        module = module_name(os.path.join(root, path), root)
        here = unit_of(module, root)
        for line, imported in imports_of(source, module, path.endswith("__init__.py")):
            there = unit_of(imported, root)
            if there is None or there == here:
                continue
            if here not in LEVEL or there not in LEVEL:
                why = ("an entry script" if there == "script" else f"a unit LAYERS does not list ({here} -> "
                       f"{there})")
            elif LEVEL[there] >= LEVEL[here]:
                why = f"{here} may not import {there} (" + ("the same row" if LEVEL[there] == LEVEL[here] else
                                                             "a higher row") + ")"
            else:
                continue
            problems.append(f"{path}:{line}: imports {imported}: {why}")
    return problems


def first_sentence(docstring):
    """A docstring's first sentence, on one line."""
    text = " ".join(docstring.split("\n\n")[0].split())
    m = re.search(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bal)(?<!\bvs)[.!?](?=\s+[A-Z`(])", text)
    return text[:m.end()] if m else text


def docstring_of(path):
    with open(path, encoding="utf-8") as f:
        return ast.get_docstring(ast.parse(f.read())) or ""


def label(unit):
    """How the diagram names a unit: its file, or its folder."""
    return {"tpcomm": "tpcomm/__init__.py", "tp": "tpcomm/tp/ (with compress/)",
            "experiments/ways": "tpcomm/experiments/ways.py"}.get(
        unit, unit if unit.endswith(".py") else f"tpcomm/{unit}/")


def diagram():
    """LAYERS drawn top (imports the most) to bottom, one row per line."""
    rows = ["   ".join(label(u) for u in row) for row in reversed(LAYERS)]
    width = max(map(len, rows))
    lines = ["entry scripts (train.py, bench.py, sample.py, experiment.py, ...): import any row, imported by "
             "none", " " * (width // 2) + "|"]
    for i, row in enumerate(rows):
        lines.append(row.center(width).rstrip())
        if i < len(rows) - 1:
            lines.append(" " * (width // 2) + "v")
    return "\n".join(lines)


def sentence_of(path):
    """The first sentence of a module's docstring, as prose: its `code` marks dropped (a command quoted in
    part, `python experiment.py report [SWEEP ...]`, is no command tests/house/test_docs.py could run)."""
    return first_sentence(docstring_of(path)).replace("`", "")


def module_lines(paths, root):
    """'- `path`: first sentence' per module, __init__.py left out (its docstring heads the group)."""
    return [f"- [`{os.path.relpath(p, root)}`](../{os.path.relpath(p, root)}): {sentence_of(p)}"
            for p in paths if os.path.basename(p) != "__init__.py"]


def layout_page(ctx=None, root=None):
    """The generated part of docs/layout.md (report.py's block `layout`)."""
    root = root or (ctx.root if ctx is not None else ROOT)
    out = ["### The layers", "", "Each row imports only from the rows below it, never from its own row's "
           "other units (`tpcomm/experiments/report/layout.py` LAYERS; tests/house/test_layering.py "
           "checks every import):", "", "```text", diagram(), "```", "", "### Top-level files", "", "The "
           "entry scripts, and the two model files LAYERS places.", ""]
    out += module_lines(sorted(glob.glob(os.path.join(root, "*.py"))), root)
    for package in sorted(glob.glob(os.path.join(root, "tpcomm", "**", "__init__.py"), recursive=True),
                          key=lambda p: (LEVEL.get(unit_of(module_name(p, root), root), len(LEVEL)), p)):
        folder = os.path.dirname(package)
        out += ["", f"### {os.path.relpath(folder, root)}/", "", sentence_of(package)]
        modules = module_lines(sorted(glob.glob(os.path.join(folder, "*.py"))), root)
        out += [""] + modules if modules else []
    return "\n".join(out)
