"""The layout's rules: the package never imports an entry script, no import cycles, no module over
600 lines, train.py a short flat loop, one validator for the model options; and every hostile input the issue
lists refused in one line with exit status 2, nothing written."""

import ast
import functools
import glob
import json
import os
import shutil

import pytest
import torch

from tpcomm.errors import ConfigError
from tpcomm.configuration import configure
from conftest import ROOT, TINY, one_line_error, run_script

ENTRY_SCRIPTS = {"train", "bench", "sample", "experiment", "spd", "export_hf", "comm_model",
                 "test_20k_experiment"}


def imported_modules(source):
    """Every module a Python source imports, at any depth (inside functions too): 'a.b' for `import a.b` and
    for `from a.b import c`, and 'a.b.c' too for the latter (c may be a module)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def entry_imports(source):
    """The entry scripts a source imports (by their top-level name)."""
    return sorted({name.split(".")[0] for name in imported_modules(source)} & ENTRY_SCRIPTS)


def test_the_detector_sees_an_entry_script_imported_anywhere():
    """Anti-vacuity: the check below would flag a package module that imports train, at the top or inside a
    function, in either import form."""
    assert entry_imports("import train\n") == ["train"]
    assert entry_imports("def f():\n    from bench import pattern_label\n    return "
                         "pattern_label\n") == ["bench"]
    assert entry_imports("import os\nfrom tpcomm import results\nfrom model import GPT\n") == []


def test_the_package_never_imports_an_entry_script():
    found = {os.path.relpath(p, ROOT): entry_imports(open(p).read())
             for p in sorted(glob.glob(os.path.join(ROOT, "tpcomm", "**", "*.py"), recursive=True))}
    assert len(found) > 30  # the package's modules were read
    assert {path: names for path, names in found.items() if names} == {}


def import_cycle(graph):
    """One cycle of the module graph {module: modules it imports}, as a list that starts and ends with
    the same module, or None."""
    state, path = {}, []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        state[m] = "done"
        path.pop()
        return None

    return next((c for m in sorted(graph) if m not in state and (c := visit(m))), None)


def test_the_cycle_detector_can_fail():
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycles():
    """The repository's modules (top-level scripts and tpcomm/) import each other without a cycle, counting
    imports inside functions too: each module sits on a floor below everything that imports it."""
    paths = glob.glob(os.path.join(ROOT, "*.py")) + glob.glob(os.path.join(ROOT, "tpcomm", "**", "*.py"),
                                                              recursive=True)
    names = {os.path.relpath(p, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__"): p for p in paths}
    graph = {m: imported_modules(open(p).read()) & set(names) - {m} for m, p in names.items()}
    assert len(graph) > 40 and sum(map(len, graph.values())) > 100  # the modules and their imports were read
    assert import_cycle(graph) is None


LINE_LIMIT = 110


def long_lines(text):
    """[(line number, length)] of the lines of text over LINE_LIMIT characters."""
    return [(i, len(line)) for i, line in enumerate(text.split("\n"), 1) if len(line) > LINE_LIMIT]


def test_no_python_line_over_110_characters():
    """Every tracked Python file (scripts, tpcomm/, tests/, data/, config/) keeps its lines within 110
    characters; a planted 111-character line is caught (the check can fail)."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True)
    paths = tracked.stdout.split()
    assert len(paths) > 150 and "tpcomm/model/strategies.py" in paths  # the repository's files were listed
    over = {p: long_lines(open(os.path.join(ROOT, p), encoding="utf-8").read()) for p in paths}
    assert {p: lines for p, lines in over.items() if lines} == {}
    assert long_lines("x = 1\n" + "#" * 111 + "\n") == [(2, 111)] and long_lines("#" * 110) == []


def test_no_module_over_600_lines_and_train_py_a_short_loop():
    paths = glob.glob(os.path.join(ROOT, "*.py")) + glob.glob(os.path.join(ROOT, "tpcomm", "**", "*.py"),
                                                              recursive=True)
    lines = {os.path.relpath(p, ROOT): sum(1 for _ in open(p)) for p in paths}
    assert {p: n for p, n in lines.items() if n > 600} == {}
    assert lines["train.py"] <= 400, lines["train.py"]


def too_long(source, *, function=80, klass=200):
    """(kind, name, lines) of every function over `function` lines and class over `klass` lines in a source,
    at any depth (methods and nested functions too), decorators and docstrings counted."""
    out = []
    for node in ast.walk(ast.parse(source)):
        n = node.end_lineno - node.lineno + 1 if hasattr(node, "end_lineno") else 0
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and n > function:
            out.append(("function", node.name, n))
        elif isinstance(node, ast.ClassDef) and n > klass:
            out.append(("class", node.name, n))
    return out


def test_no_function_over_80_lines_and_no_class_over_200():
    """Every function and method at most 80 lines and every class at most 200, in the package, the entry
    scripts, the tests and the data scripts; the check finds a planted long function and class."""
    paths = [p for pattern in ("*.py", "tpcomm/**/*.py", "tests/**/*.py", "data/**/*.py")
             for p in glob.glob(os.path.join(ROOT, pattern), recursive=True)]
    assert len(paths) > 150
    found = {os.path.relpath(p, ROOT): too_long(open(p).read()) for p in paths}
    assert {p: f for p, f in found.items() if f} == {}
    planted = "class Big:\n    def f(self):\n" + "        x = 1\n" * 80 + "\n" * 120 + "    y = 2\n"
    assert too_long(planted) == [("class", "Big", 203), ("function", "f", 81)]


# ---------- defaults once ----------

def literal_defaults(source, keys):
    """The keys among `keys` whose value a module's `DEFAULTS = dict(...)` writes as a literal."""
    call = next(node.value for node in ast.parse(source).body if isinstance(node, ast.Assign)
                and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["DEFAULTS"])
    return sorted(k.arg for k in call.keywords if k.arg in keys and isinstance(k.value,
                                                                               (ast.Constant, ast.List)))


def test_the_model_options_defaults_are_written_once():
    """The TPConfig keys' defaults (the sync options, tp_size, block_types, caat_sync_fraction, loss_parallel)
    live in TPConfig (options.TP_DEFAULTS); train.py's and bench.py's DEFAULTS read them, and bench.py's model
    and launch keys read train.py's, so no default of one option is written in two places."""
    from tpcomm.bench import bench_config
    from tpcomm.model.options import TP_DEFAULTS
    from tpcomm.train import train_config

    # can fail
    assert literal_defaults("DEFAULTS = dict(tp_overlap=1, seed=2)", TP_DEFAULTS) == ["tp_overlap"]
    shared = set(bench_config.DEFAULTS) & set(train_config.DEFAULTS) - {"compile", "trace",
                                                                        "pp_virtual_stages"}
    assert set(TP_DEFAULTS) <= shared and len(shared) > 20
    for module, keys in ((train_config, TP_DEFAULTS), (bench_config, shared)):
        assert literal_defaults(open(module.__file__).read(), keys) == [], module.__name__
    assert all(bench_config.DEFAULTS[k] == train_config.DEFAULTS[k] for k in shared)


# ---------- every name imports from one path: no re-exports ----------

def repository_sources(root=ROOT):
    """{module name: source} of the entry scripts, the package and the tests (tests/<folder>/x.py is 'x', as
    they import each other: conftest puts every tests/ folder on sys.path)."""
    names = {}
    for p in glob.glob(os.path.join(root, "*.py")) + glob.glob(os.path.join(root, "tpcomm", "**", "*.py"),
                                                                recursive=True):
        names[os.path.relpath(p, root)[:-3].replace(os.sep, ".").removesuffix(".__init__")] = open(p).read()
    for p in glob.glob(os.path.join(root, "tests", "**", "*.py"), recursive=True):
        names[os.path.splitext(os.path.basename(p))[0]] = open(p).read()
    return names


def reexports(sources):
    """[(module, name, importer)]: a name that a repository module imports (rather than defines) and that
    another module takes through it (`from module import name`, or `module.name` read through an imported
    module), so the name has two paths. Whether the module uses the name itself does not matter."""
    facts = {m: source_facts(src) for m, src in sources.items()}
    found = []
    for importer, (_, bindings, attributes, patched) in facts.items():
        modules = {}  # local name -> repository module it is bound to (the last binding in ast.walk's order)
        for module, name, local in bindings:
            if name is None:  # import module [as local]
                if module in facts:
                    modules[local] = module
            elif f"{module}.{name}" in facts:
                modules[local] = f"{module}.{name}"
            elif module in facts and name in facts[module][0]:
                found.append((module, name, importer))
        for local, attr in attributes:
            module = modules.get(local)
            if (module is not None and attr in facts[module][0] and f"{module}.{attr}" not in facts
                    and (local, attr) not in patched):
                found.append((module, attr, importer))
    return sorted(set(found))


@functools.lru_cache(maxsize=None)
def source_facts(source):
    """What reexports needs of one source, parsed once per text (the detector's tests read ~175 sources
    three times): the names its top level imports; its imports at any depth in ast.walk's order, `from M
    import N [as L]` as (M, N, L) and `import M [as L]` as (M, None, L); every `L.attr` read; the names
    it patches (patched_names)."""
    tree = ast.parse(source)
    top = frozenset((a.asname or a.name).split(".")[0] for node in tree.body
                    if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names)
    bindings, attributes = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            bindings += [(node.module, a.name, a.asname or a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            bindings += [(a.name, None, a.asname or a.name) for a in node.names]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            attributes.append((node.value.id, node.attr))
    return top, bindings, attributes, patched_names(tree)


def patched_names(tree):
    """{(local module name, attribute)} a source replaces where it is looked up (`module.name =
    ...` or `monkeypatch.setattr(module, "name", ...)`): reading the original there first is
    patching, not a second path."""
    out = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        out |= {(t.value.id, t.attr) for t in targets if isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)}
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "setattr" and len(node.args) >= 2 and isinstance(node.args[0], ast.Name)
            and isinstance(node.args[1], ast.Constant)):
            out.add((node.args[0].id, node.args[1].value))
    return out


def test_the_reexport_detector_can_fail():
    """Anti-vacuity: a re-export planted in the real sources (results hands on TPConfig, which two
    modules take from it, in both import forms) is found, and only it; a name the module imports and
    uses, taken through it, is one too; one no other module takes through it, or one a test patches
    where it is looked up, is not."""
    sources = repository_sources()
    planted = dict(sources)
    planted["tpcomm.experiments.results"] += "\nfrom tpcomm.model.options import TPConfig, TP_KEYS\n"
    planted["planted_a"] = "from tpcomm.experiments.results import TPConfig\n"
    planted["planted_b"] = "from tpcomm.experiments import results\nconfig = results.TPConfig\n"
    found = set(reexports(planted)) - set(reexports(sources))
    assert found == {("tpcomm.experiments.results", "TPConfig", "planted_a"),
                     ("tpcomm.experiments.results", "TPConfig", "planted_b")}
    assert reexports({"a": "X = 1\n", "b": "from a import X\nY = X\n", "c": "from b import Y\n"}) == []
    # b uses X itself, and c still takes it through b: a second path (tests/tp/test_ladder.py once did this)
    planted = {"a": "X = 1\n", "b": "from a import X\nY = X\n", "c": "from b import X\n"}
    assert reexports(planted) == [("b", "X", "c")]
    # patching a name where b looks it up reads the original there first: not a second path
    patch = "import b\nold = b.X\nb.X = None\n"
    assert reexports({"a": "X = 1\n", "b": "from a import X\nY = X\n", "c": patch}) == []


def test_no_module_reexports_a_name():
    """Every name is imported from the module that defines it, in the package, the scripts and the tests."""
    sources = repository_sources()
    assert len(sources) > 150  # the scripts, the package and the tests were read
    assert reexports(sources) == []


def test_one_validator_for_the_model_options():
    """train.py's checks, bench.py's, the sweeps', build_model and TPConfig are one function: the same
    refusal, word for word, wherever the options enter."""
    from tpcomm.bench import bench_config
    from tpcomm.model import options
    from tpcomm.train import train_config
    from tpcomm.train.build import build_model

    bad = dict(n_layer=2, n_head=4, n_embd=32, tp_size=1, tp_overlap=2)
    messages = []
    for check in (lambda: options.TPConfig(**bad), lambda: build_model("distributed_gpt", bad),
                  lambda: train_config.check_offline(dict(train_config.defaults(),
                                                          model_type="distributed_gpt", **bad)),
                  lambda: bench_config.validate(dict(bench_config.defaults(), model_type="distributed_gpt",
                                                     **bad))):
        with pytest.raises(ConfigError) as e:
            check()
        messages.append(str(e.value))
    assert len(set(messages)) == 1 and "tp_overlap=2" in messages[0] and "tp_size=1" in messages[0], messages


def test_expand_block_types_is_the_one_expansion():
    from tpcomm.train.checkpoint import checkpoint_model
    from tpcomm.model.options import TPConfig, expand_block_types

    assert expand_block_types(None, 3) == ["tp"] * 3 and expand_block_types("spd", 2) == ["spd", "spd"]
    assert TPConfig(n_layer=2, n_head=4, n_embd=32, tp_size=2,
                    block_types="ladder").block_types == ["ladder"] * 2
    ckpt = dict(model_type="distributed_gpt", model_args=dict(n_layer=3, n_head=4, n_embd=32, block_size=8,
                                                              bias=False, vocab_size=65, dropout=0.0),
                model_options={})
    assert checkpoint_model(ckpt)[1]["block_types"] == ["tp"] * 3


def test_bench_takes_every_model_key_as_a_flag():
    """bench.py's options hold train.py's model keys; a flag is the base every --variants entry changes."""
    from tpcomm.bench import bench_config
    from tpcomm.train import train_config
    from tpcomm.model.options import TP_KEYS

    model_keys = {"n_layer", "n_head", "n_embd", "block_size", "bias", "gelu_approximate", "model_type",
                  *TP_KEYS}
    assert model_keys <= set(bench_config.DEFAULTS) and model_keys <= set(train_config.DEFAULTS)
    cfg = configure(bench_config.DEFAULTS, ["--model_type=distributed_gpt", "--tp_size=2", "--n_layer=2",
                                            "--n_head=4", "--n_embd=32", "--batch_size=4", "--tp_overlap=2",
                                            "--variants=[{}, {'tp_overlap': 1}]"])
    bench_config.validate(cfg)
    runs, _ = bench_config.combinations(cfg)
    names = [bench_config.variant_name(bench_config.sync_options(cfg, v)) for _, v in runs]
    assert names == [" +overlap2", ""]


# ---------- train.py reads the loss at log steps only ----------

def test_the_loss_is_not_read_every_micro_step(tmp_path, char_data, monkeypatch):
    """No .item() (a device sync on a GPU) from this repo's code inside a training step (torch's CPU
    AdamW reads its step counts with .item(), once per parameter and step); read_loss gives the
    number a per-micro-step .item() summed in order would (float64 sum of the fp32 parts), so the
    logged losses are unchanged."""
    import traceback

    import train
    from tpcomm.parallel.parallel_dims import init_parallel
    from tpcomm.train.train_config import prepare
    from tpcomm.train.training import start_run

    cfg, setup = prepare([*TINY, f"--data_dir={char_data}", f"--out_dir={tmp_path / 'out'}",
                          "--gradient_accumulation_steps=3", "--max_iters=1"])
    pd = init_parallel(dp=setup.dp, tp=setup.tp, pp=setup.pp, device_type=setup.device_type)
    training = start_run(cfg, setup, pd)
    reads = []
    item = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item",
                        lambda self: reads.append(traceback.extract_stack()[-2].filename) or item(self))
    loss, _ = train.train_step(training)
    assert len(reads) > 0  # anti-vacuity: the counter sees .item() calls (AdamW's)
    assert [f for f in reads if f.startswith(ROOT + os.sep)] == [] and len(loss) == 3
    monkeypatch.undo()
    expected = 0.0
    for part in loss:
        expected += part.item()
    assert train.read_loss(training, loss) == expected
    parts = [torch.tensor(x, dtype=torch.float32) for x in (1.1, 2.2, 3.3)]
    assert train.read_loss(training, parts) == (parts[0].item() + parts[1].item()) + parts[2].item()


# ---------- hostile input: one line, exit status 2, nothing written ----------

@pytest.mark.parametrize("args, words", [(["--tp_size=1", "--tp_overlap=2"], ["tp_overlap=2", "tp_size=1"]),
                                         (["--tp_size=1", "--sequence_parallel=True"],
                                          ["sequence_parallel=True", "tp_size=1"]),
                                         (["--tp_size=2", "--tp_comm_block=7"], ["tp_comm_block=7",
                                                                                 "tp_comm_dtype=None"]),
                                         (["--tp_size=2", "--tp_comm_dtype=bf16", "--tp_comm_block=7"],
                                          ["tp_comm_block=7", "'bf16'", "no scales"]),])
def test_train_refuses_sync_options_that_would_do_nothing(tmp_path, char_data, args, words):
    r = run_script("train.py", *TINY, "--model_type=distributed_gpt", f"--data_dir={char_data}",
                   f"--out_dir={tmp_path / 'out'}", *args, timeout=300)
    line = one_line_error(r)
    assert all(w in line for w in words) and "scales' blocks" not in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("variants, words", [
    ("[{}, {'tp_comm_block': 7}]", ["variants", "tp_comm_block=7"]),
    ("[{}, {'tp_comm_dtype': 'int4'}]", ["variants", "tp_comm_dtype", "'int4'"]),
])
def test_bench_refuses_a_variant_that_runs_with_no_pattern(variants, words):
    r = run_script("bench.py", "--device=cpu", "--n_layer=2", "--n_head=4", "--n_embd=32", "--block_size=16",
                   "--vocab_size=65", "--iters=1", "--warmup=0", "--model_type=distributed_gpt",
                   "--tp_size=2", f"--variants={variants}", timeout=300)
    line = one_line_error(r)
    assert all(w in line for w in words), line


def test_bench_takes_tp_overlap_as_a_flag_and_refuses_it_at_tp_1():
    r = run_script("bench.py", "--device=cpu", "--n_layer=2", "--n_head=4", "--n_embd=32", "--block_size=16",
                   "--vocab_size=65", "--iters=1", "--model_type=distributed_gpt", "--tp_size=1",
                   "--tp_overlap=2", timeout=300)
    line = one_line_error(r)
    assert "tp_overlap=2" in line and "tp_size=1" in line and "unknown" not in line, line


def test_a_result_file_holding_nan_or_infinity_is_refused_naming_the_file(tmp_path):
    from tpcomm.experiments import results
    from tpcomm.experiments.result_check import ResultsError

    committed = sorted(glob.glob(os.path.join(ROOT, "experiments", "*", "runs", "*.json")))[0]
    with open(committed) as f:
        record = json.load(f)
    for bad in (float("nan"), float("inf")):
        path = tmp_path / "run-seed1.json"
        path.write_text(json.dumps(dict(record, val_loss=bad)))  # written as NaN / Infinity
        with pytest.raises(ResultsError) as e:
            results.read_record(str(path))
        assert str(path) in str(e.value) and "val_loss" in str(e.value), str(e.value)
    path.write_text(json.dumps(dict(record, val_curve=[[0, 0, float("nan")]])))
    with pytest.raises(ResultsError, match="val_curve"):
        results.read_record(str(path))
    results.read_record(committed)  # anti-vacuity: the committed file itself is accepted


@pytest.mark.parametrize("extra", [[], ["--dry-run"]])
def test_experiment_out_must_be_a_directory(tmp_path, extra):
    out = tmp_path / "a-file"
    out.write_text("mine")
    line = one_line_error(run_script("experiment.py", "cpu", f"--out={out}", *extra, timeout=300))
    assert f"--out={out}" in line and "not a directory" in line, line
    assert out.read_text() == "mine" and os.listdir(tmp_path) == ["a-file"]


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc (Linux)")
def test_experiment_dry_run_refuses_a_folder_that_cannot_be_made(tmp_path):
    """/proc/x: as root /proc reads writable, yet nothing can be made in it; a new folder under tmp_path plans
    and is not made (the comparison can fail)."""
    line = one_line_error(run_script("experiment.py", "cpu", "--out=/proc/x", "--dry-run", timeout=300))
    assert "--out" in line and "/proc" in line, line
    r = run_script("experiment.py", "cpu", f"--out={tmp_path}/new/deeper", "--dry-run", timeout=300)
    assert r.returncode == 0 and "run   python train.py" in r.stdout and os.listdir(tmp_path) == [], r.stderr


def test_report_only_into_an_empty_directory_leaves_nothing_behind(tmp_path):
    line = one_line_error(run_script("experiment.py", "cpu", "--report-only", f"--out={tmp_path}",
                                     timeout=300))
    assert str(tmp_path) in line and "no finished runs" in line, line
    assert os.listdir(tmp_path) == []  # no .lock


@pytest.fixture(scope="module")
def trained(char_data, tmp_path_factory):
    """A trained run's out_dir/ckpt.pt (an untrained tiny GPT written as train.py writes checkpoints):
    what the converters read."""
    import pickle

    from tpcomm.train.build import build_model
    from tpcomm.train.checkpoint import make_checkpoint, save_checkpoint

    with open(os.path.join(char_data, "meta.pkl"), "rb") as f:
        vocab_size = pickle.load(f)["vocab_size"]
    model = build_model("gpt", dict(n_layer=2, n_head=4, n_embd=32, block_size=32, vocab_size=vocab_size,
                                    bias=False, dropout=0.0))
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    checkpoint = make_checkpoint(model, optimizer, torch.amp.GradScaler("cpu", enabled=False),
                                 model_type="gpt", iter_num=1, best_val_loss=9.0,
                                 config=dict(dataset="chars", data_dir=char_data))
    out = str(tmp_path_factory.mktemp("converters") / "run")
    os.makedirs(out)
    save_checkpoint(checkpoint, out)
    return out


@pytest.mark.parametrize("args, kind", [(["--distill_steps=0"], "spd"),
                                        (["--block=ladder", "--retrain_steps=0"], "ladder")])
def test_converters_refuse_to_replace_a_checkpoint_without_overwrite(trained, args, kind):
    """A converted checkpoint (perhaps fine-tuned since: iter 5) is never replaced
    without --overwrite=True."""
    folder = os.path.join(trained, kind)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    kept = os.path.join(folder, "ckpt.pt")
    with open(kept, "wb") as f:
        f.write(b"an earlier conversion, fine-tuned to iter 5")
    command = ["spd.py", *args, f"--out_dir={trained}", "--tp_size=2", "--eval_iters=1", "--batch_size=2"]
    line = one_line_error(run_script(*command, timeout=300))
    assert "overwrite=False" in line and kept in line and "--overwrite=True" in line, line
    assert open(kept, "rb").read() == b"an earlier conversion, fine-tuned to iter 5"
    assert os.listdir(folder) == ["ckpt.pt"]
    # anti-vacuity: asked to, the same conversion replaces it
    r = run_script(*command, "--overwrite=True", timeout=600)
    assert r.returncode == 0, r.stderr
    assert torch.load(kept, weights_only=True)["model_type"] == "distributed_gpt"


def test_ladder_layers_zero_is_refused_before_anything_is_written(tmp_path):
    line = one_line_error(run_script("spd.py", "--block=ladder", "--ladder_layers=0", f"--out_dir={tmp_path}",
                                     timeout=300))
    assert "ladder_layers" in line and "got 0" in line, line
    assert os.listdir(tmp_path) == []


def test_the_ladder_module_runs_as_a_script():
    """python -m tpcomm.convert.ladder_conversion is spd.py --block=ladder (it
    used to exit 0 saying nothing)."""
    line = one_line_error(run_script("-m", "tpcomm.convert.ladder_conversion", "--ladder_layers=0",
                                     timeout=300))
    assert "ladder_layers" in line, line
