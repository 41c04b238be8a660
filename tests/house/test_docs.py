"""
Every example command in README.md and docs/*.md names things that exist: the script or the `-m` module, the
config files, and every `--key` the script accepts, with a value of the right type. Nothing is run: each
script's own parser reads the arguments (configure() on the script's defaults, the sweep's and the trace's
argument parsers with their work stubbed out, the prepare scripts' argparse options read from their source),
so the whole file takes a few seconds.

What counts as a command: a line inside a ``` code block, or an inline `...` code span, that (after a `$ `
prompt, shell keywords such as `do`, and environment assignments such as OMP_NUM_THREADS=1) starts with
`python` or `torchrun`; a trailing backslash continues a code line; `&&`, `;` and `|` separate commands.

The README's commands also run on a fresh clone, and twice (the test_readme_commands_run_on_a_fresh_clone...
test): train.py with --overwrite=True, a command that reads an earlier one's output saying `# needs ...`, and
no sweep training into a directory of committed result files.

Placeholders, the only things not checked: a token `...` (it stands for more arguments), and the value of an
argument written `--key=...` or `--key=$VAR` (a shell variable): for those the key is still checked, the value
is not. torchrun's own options are not checked (they are torchrun's); they must be written `--opt=value`.
"""

import ast
import contextlib
import glob
import importlib
import importlib.util
import io
import os
import re
import shlex
import sys
from unittest import mock

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

DOC_FILES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs",
                                                                                            "*.md")))
PROGRAMS = ("python", "python3", "torchrun")
SHELL_KEYWORDS = ("do", "then", "else", "time", "!")
SEPARATORS = (";", "&&", "||", "|", "&", ";;", "(", ")")
REDIRECTIONS = (">", ">>", "<", ">&", "&>")
ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
SHELL_VARIABLE = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
MENTIONS_PROGRAM = re.compile(r"(^|[\s;&|(])(python3?|torchrun)(\s|$)")


# ------------------------------------------------------------------------------------------------------------
# extraction


def tokenize(line):
    """Shell words of a line, `#` comments dropped, with ; && | as words of their own."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def commands_in_line(line):
    """The python/torchrun commands of one shell line, each a list of words."""
    line = line.strip()
    if line.startswith("$ "):
        line = line[2:]
    if not MENTIONS_PROGRAM.search(line):
        return []
    try:
        words = tokenize(line)
    except ValueError as e:  # unbalanced quotes: a broken command, or prose that mentions python
        first = [w for w in line.split() if not ENV_ASSIGNMENT.match(w)][:1]
        return [["<unparsable>", str(e)]] if first and first[0] in PROGRAMS else []
    commands, current, skip = [], [], False
    for w in words + [";"]:
        if skip:  # the target of a redirection
            skip = False
        elif w in REDIRECTIONS:
            skip = True
        elif w in SEPARATORS:
            commands.append(current)
            current = []
        else:
            current.append(w)
    found = []
    for words in commands:
        while words and (words[0] in SHELL_KEYWORDS or ENV_ASSIGNMENT.match(words[0])):
            words = words[1:]
        if words and words[0] in PROGRAMS:
            found.append(words)
    return found


def extract_commands(text):
    """[(line number, command text, words)] of a markdown text: code-block lines and inline code spans."""
    lines = text.split("\n")
    found, outside = [], list(lines)
    in_block, pending, pending_line = False, "", None
    for i, line in enumerate(lines, start=1):
        if FENCE.match(line):
            in_block = not in_block
            outside[i - 1] = ""
            continue
        if not in_block:
            continue
        outside[i - 1] = ""  # code-block lines are not searched for inline spans
        if pending_line is None:
            pending_line = i
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full, start = pending + line, pending_line
        pending, pending_line = "", None
        found += [(start, full.strip(), words) for words in commands_in_line(full)]
    # inline code spans may wrap over a line break, as markdown allows
    rest = "\n".join(outside)
    for m in INLINE_CODE.finditer(rest):
        span = " ".join(m.group(2).split())
        lineno = rest.count("\n", 0, m.start()) + 1
        bare = span[2:] if span.startswith("$ ") else span
        words = bare.split()
        while words and ENV_ASSIGNMENT.match(words[0]):
            words = words[1:]
        if len(words) >= 2 and words[0] in ("python", "torchrun"):
            found += [(lineno, span, w) for w in commands_in_line(bare)]
    return sorted(found, key=lambda c: c[0])


# ------------------------------------------------------------------------------------------------------------
# checking


def is_placeholder(value):
    return value == "..." or SHELL_VARIABLE.fullmatch(value) is not None


def split_arguments(args):
    """(arguments to parse, keys whose placeholder value is not checked); `...` tokens are dropped."""
    parse, keys_only = [], []
    for a in args:
        if a == "...":
            continue
        if a.startswith("--") and "=" in a and is_placeholder(a.split("=", 1)[1]):
            keys_only.append(a[2:].split("=", 1)[0])
        else:
            parse.append(a if a.startswith("-") or os.path.isabs(a) else os.path.join(ROOT, a))
    return parse, keys_only


def configure_check(defaults, args, *, extra_keys=()):
    """Parse args as configure() does for a script with these defaults; the problems found."""
    from tpcomm.errors import ConfigError
    from tpcomm.configuration import configure

    parse, keys_only = split_arguments(args)
    problems = [f"unknown key --{k}" for k in keys_only if k not in defaults and k not in extra_keys]
    try:
        configure(defaults, parse)
    except ConfigError as e:
        problems.append(str(e).replace(ROOT + os.sep, ""))
    return problems


def run_main_quietly(main, argv):
    """Call a script's main (whose work is stubbed out by the caller); a one-line error exit is a problem."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            main(argv)
    except SystemExit as e:
        if e.code not in (0, None):
            return [out.getvalue().strip() or f"exit status {e.code}"]
    return []


def check_train(args):
    from tpcomm.train.train_config import DEFAULTS

    return configure_check(DEFAULTS, args)


def check_sample(args):
    import sample

    return configure_check(sample.DEFAULTS, args)


def check_bench(args):
    from tpcomm.bench import bench_config

    return configure_check(bench_config.DEFAULTS, args)


def check_spd(args):
    import spd
    from tpcomm.errors import ConfigError

    try:
        block, rest = spd.split_block(args)  # --block picks the conversion, whose keys the rest are
    except ConfigError as e:
        return [str(e)]
    return configure_check(spd.CONVERSIONS[block][0], rest)


def check_export_hf(args):
    from tpcomm.convert import hf_export

    return configure_check(hf_export.DEFAULTS, args)


def check_comm_model(args):
    import comm_model

    command, rest = "predict", [a for a in args if a != "..."]
    if rest and not rest[0].startswith("--"):
        command, rest = rest[0], rest[1:]
    if command not in comm_model.COMMANDS:
        return [f"unknown command {command!r} (comm_model.py takes {', '.join(comm_model.COMMANDS)})"]
    return configure_check(comm_model.COMMANDS[command][0], rest)


def check_experiment(args):
    from tpcomm.experiments import sweep_args, sweep_records
    from tpcomm.train.train_config import DEFAULTS

    parse, keys_only = split_arguments(args)
    # the sweep's name, not a path
    parse = [os.path.relpath(a, ROOT) if os.path.isabs(a) else a for a in parse]
    if parse[:1] == ["gpu-node"]:  # its own runner (tpcomm/experiments/gpu_node.py)
        from tpcomm.experiments import gpu_node

        try:
            gpu_node.parse(parse[1:])
        except gpu_node.NodeError as e:
            return [str(e)]
        return [f"unknown key --{k}" for k in keys_only if k not in gpu_node.OPTIONS]
    # its own options (tpcomm/experiments/gpu_scale.py), then train.py overrides
    if parse[:1] == ["gpu-scale"]:
        from tpcomm.experiments import gpu_scale

        try:
            _, overrides = gpu_scale.parse(parse[1:])
        except sweep_records.SweepError as e:
            return [str(e)]
        return [f"unknown key --{k}" for k in keys_only if k not in gpu_scale.OPTIONS and k not in DEFAULTS] \
            + configure_check(DEFAULTS, overrides)
    problems = [f"unknown key --{k}" for k in keys_only if k not in DEFAULTS
                and k not in sweep_args.RUNNER_OPTIONS]
    try:
        _, _, overrides = sweep_args.parse_args(parse)
    except sweep_records.SweepError as e:
        return problems + [str(e)]
    return problems + configure_check(DEFAULTS, overrides)


def pipeline_demo_defaults():
    """tpcomm/bench/pipeline_demo.py's DEMO (the demo's keys)."""
    return importlib.import_module("tpcomm.bench.pipeline_demo").DEMO


def check_pipeline_demo(args):
    return configure_check(pipeline_demo_defaults(), args)


def check_trace(args):
    from tpcomm.bench import trace

    argv = [a for a in args if a != "..."]
    with mock.patch.object(trace, "summary", lambda path: []), \
            mock.patch.object(trace, "plot_timeline", lambda *a, **k: None):
        return run_main_quietly(trace.main, argv)


def check_sharded_checkpoint(args):
    from tpcomm.train import sharded_checkpoint

    with mock.patch.object(sharded_checkpoint, "convert", lambda out_dir: os.path.join(out_dir, "ckpt.pt")):
        return run_main_quietly(sharded_checkpoint.main, [a for a in args if a != "..."])


def argparse_options(path):
    """The option strings a prepare script's argparse accepts, read from its source (and data/sources.py's
    shakespeare_cli when it uses that), without importing it (openwebtext's imports datasets)."""
    def options_in(tree):
        return {a.value for node in ast.walk(tree) if isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == "add_argument"
                for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")}

    tree = ast.parse(open(path).read())
    options = options_in(tree) | {"-h", "--help"}
    if any(isinstance(n, ast.Name) and n.id == "shakespeare_cli" for n in ast.walk(tree)):
        sources = ast.parse(open(os.path.join(ROOT, "data", "sources.py")).read())
        (cli,) = [n for n in sources.body if isinstance(n, ast.FunctionDef) and n.name == "shakespeare_cli"]
        options |= options_in(cli)
    return options


def check_prepare(script):
    def check(args):
        options = argparse_options(os.path.join(ROOT, script))
        return [f"unknown option {a.split('=', 1)[0]} ({script} takes {', '.join(sorted(options))})"
                for a in args if a.startswith("-") and a.split("=", 1)[0] not in options]
    return check


SCRIPT_CHECKS = {
    "train.py": check_train, "sample.py": check_sample, "bench.py": check_bench, "spd.py": check_spd,
    "export_hf.py": check_export_hf, "comm_model.py": check_comm_model, "experiment.py": check_experiment,
}
def check_gpu_check(args):
    from tpcomm.gpu import gpu_check

    return configure_check(gpu_check.DEFAULTS, args)


MODULE_CHECKS = {"tpcomm.bench.pipeline_demo": check_pipeline_demo, "tpcomm.bench.trace": check_trace,
                 "tpcomm.train.sharded_checkpoint": check_sharded_checkpoint,
                 "tpcomm.gpu.gpu_check": check_gpu_check}


def module_problem(name):
    """None if `python -m name` finds the module: a file in the repository when its package is one of ours."""
    top = name.split(".")[0]
    if os.path.isdir(os.path.join(ROOT, top)) or os.path.isfile(os.path.join(ROOT, top + ".py")):
        base = os.path.join(ROOT, *name.split("."))
        if os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__main__.py")):
            return None
        return f"module {name} not found: no {os.path.relpath(base, ROOT)}.py"
    if importlib.util.find_spec(top) is None:
        return f"module {name} is neither in the repository nor installed"
    return None


def check_command(words):
    """The problems of one command (a list of shell words); [] when it is fine."""
    if words[0] == "<unparsable>":
        return [f"cannot split into shell words: {words[1]}"]
    program, rest = words[0], words[1:]
    if program == "torchrun":
        i = 0
        while i < len(rest) and rest[i] != "-m" and (rest[i].startswith("-") or rest[i] == "..."):
            i += 1  # torchrun's own options (--opt=value)
        rest = rest[i:]
    else:
        while rest and rest[0] in ("-u", "-O", "-B", "..."):
            rest = rest[1:]  # the interpreter's own options
    if not rest:
        return ["no script or module named"]
    if rest[0] == "-c":
        return []  # inline code
    if rest[0] == "-m":
        if len(rest) < 2:
            return ["-m without a module"]
        name, args = rest[1], rest[2:]
        problem = module_problem(name)
        problems = [problem] if problem else []
        check = MODULE_CHECKS.get(name)
        return problems + (check(args) if check else [])
    script, args = rest[0], rest[1:]
    if not os.path.isfile(os.path.join(ROOT, script)):
        return [f"script {script} not found"]
    check = SCRIPT_CHECKS.get(os.path.normpath(script))
    if check is None and re.fullmatch(r"data/[^/]+/prepare\.py", os.path.normpath(script)):
        check = check_prepare(os.path.normpath(script))
    return check(args) if check else []


def problems_of(doc):
    """'file:line: `command`: problem' for every bad command of one markdown file."""
    with open(os.path.join(ROOT, doc)) as f:
        commands = extract_commands(f.read())
    return [f"{doc}:{line}: `{text}`: {p}" for line, text, words in commands for p in check_command(words)]


# ------------------------------------------------------------------------------------------------------------
# tests


@pytest.mark.parametrize("doc", DOC_FILES)
def test_every_command_names_what_exists(doc):
    problems = problems_of(doc)
    assert not problems, "commands that would fail:\n" + "\n".join(problems)


def test_the_readme_shows_every_tool():
    """Not vacuous: the README's commands are found, and there is one for each tool."""
    with open(os.path.join(ROOT, "README.md")) as f:
        commands = extract_commands(f.read())
    targets = set()
    for _, _, words in commands:
        rest = [w for w in words[1:] if not (w.startswith("--") or ENV_ASSIGNMENT.match(w) or w == "...")]
        targets.add(words[words.index("-m") + 1] if "-m" in words else rest[0] if rest else None)
    for tool in ("train.py", "sample.py", "bench.py", "experiment.py", "spd.py", "export_hf.py",
                 "comm_model.py", "tpcomm.bench.trace", "tpcomm.bench.pipeline_demo",
                 "data/shakespeare_char/prepare.py"):
        assert tool in targets, f"README.md has no command for {tool}; found {sorted(filter(None, targets))}"
    assert len(commands) >= 20


def test_the_checker_rejects_bad_commands():
    """Anti-vacuity: a made-up flag, a missing script, module or config file, a bad value are each caught."""
    bad = [
        "python train.py --no_such_key=1",
        "python no_such_script.py --x=1",
        "python -m tpcomm.no_such_module",
        "torchrun --standalone --nproc_per_node=2 -m tpcomm.no_such_module",
        "python train.py config/no_such_config.py",
        "OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 bench.py --iters=abc",
        "python sample.py --no_such_key=1",
        "python spd.py --no_such_key=1",
        "python export_hf.py --no_such_key=1",
        "python comm_model.py no_such_command",
        "python comm_model.py measure --no_such_key=1",
        "python experiment.py no_such_sweep",
        "python experiment.py cpu --no_such_key=1",
        "python -m tpcomm.bench.trace plot out.png a.json --no_such=1",
        "python -m tpcomm.bench.trace no_such_command a.json",
        "python -m tpcomm.train.sharded_checkpoint",
        "torchrun --standalone --nproc_per_node=8 -m tpcomm.bench.pipeline_demo --no_such_key=1",
        "python data/shakespeare_char/prepare.py --no_such 1",
        "python data/openwebtext/prepare.py --no_such=1",
        "python train.py --pp_size=$pp --no_such_key=$pp",
    ]
    for text in bad:
        (words,) = commands_in_line(text)
        assert check_command(words), f"the checker accepts {text!r}"
    good = [
        "python train.py config/train_shakespeare_char_cpu.py --max_iters=10 --block_types=\"['spd']*4\"",
        "torchrun --standalone --nproc_per_node=2 bench.py --pp_size=$pp --iters=3",
        "python experiment.py cpu --seeds=1337,1338 --max_iters=20",
        "python comm_model.py validate --calibration=/tmp/c.json",
        "python -m tpcomm.bench.trace summary /tmp/trace/trace-24comm.json",
        "python -m tpcomm.train.sharded_checkpoint OUT_DIR",
        "python data/openwebtext/prepare.py --input a.txt b.txt --num_proc 1",
        "python -m pytest -q tests/house/test_docs.py",
    ]
    for text in good:
        (words,) = commands_in_line(text)
        assert check_command(words) == [], f"the checker rejects {text!r}: {check_command(words)}"


def test_extraction_finds_commands_where_the_docs_write_them():
    text = "\n".join([
        "Run `python train.py --max_iters=1` or",               # 1: inline span
        "`torchrun --standalone --nproc_per_node=2",             # 2: an inline span over a line break
        "sample.py --tp_mode=real`, not `pythonic` nor `python`.",
        "```sh",
        "$ python bench.py --iters=3   # a comment",           # 5: a prompt
        "OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 \\",  # 6: env and a continuation
        "    train.py --tp_mode=real",
        "python data/shakespeare_char/prepare.py && python train.py --out_dir=a",  # 8: two commands
        "for pp in 1 2; do torchrun --nproc_per_node=$pp bench.py --pp_size=$pp; done",  # 9: a loop
        "make experiment",
        "I'll print this output line, python or not",
        "```",
        "`make test` and `python -m tpcomm.bench.trace summary f.json`",  # 13
    ])
    found = [(line, words) for line, _, words in extract_commands(text)]
    assert found == [
        (1, ["python", "train.py", "--max_iters=1"]),
        (2, ["torchrun", "--standalone", "--nproc_per_node=2", "sample.py", "--tp_mode=real"]),
        (5, ["python", "bench.py", "--iters=3"]),
        (6, ["torchrun", "--standalone", "--nproc_per_node=2", "train.py", "--tp_mode=real"]),
        (8, ["python", "data/shakespeare_char/prepare.py"]),
        (8, ["python", "train.py", "--out_dir=a"]),
        (9, ["torchrun", "--nproc_per_node=$pp", "bench.py", "--pp_size=$pp"]),
        (13, ["python", "-m", "tpcomm.bench.trace", "summary", "f.json"]),
    ], found
    # a bad command is reported with its file and line
    problems = [f"X.md:{line}: {p}" for line, _, words in extract_commands("a\n\n`python train.py --nope=1`")
                for p in check_command(words)]
    assert len(problems) == 1 and problems[0].startswith("X.md:3: ") and "nope" in problems[0], problems


def heading_anchors(path):
    """GitHub's anchors of a markdown file's headings: lower case, punctuation dropped, spaces to hyphens."""
    anchors, in_block = set(), False
    with open(path) as f:
        for line in f:
            if FENCE.match(line):
                in_block = not in_block
            elif not in_block and line.startswith("#"):
                title = line.lstrip("#").strip().lower()
                anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_links_between_pages_resolve():
    """Relative links and images in README.md and docs/*.md point at files of the repository (and at headings
    that exist); every docs page is linked from the README."""
    link = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
    linked_from_readme = set()
    for doc in DOC_FILES:
        with open(os.path.join(ROOT, doc)) as f:
            text = f.read()
        for target in link.findall(text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = os.path.normpath(os.path.join(ROOT, os.path.dirname(doc),
                                                 file)) if file else os.path.join(ROOT, doc)
            assert os.path.exists(path), f"{doc}: link to {target}: no such file"
            assert path.startswith(ROOT + os.sep), f"{doc}: link to {target} leaves the repository"
            if anchor and path.endswith(".md"):
                assert anchor in heading_anchors(path), f"{doc}: link to {target}: no such heading"
            if doc == "README.md":
                linked_from_readme.add(os.path.relpath(path, ROOT))
    pages = {d for d in DOC_FILES if d.startswith("docs" + os.sep)}
    unlinked = pages - linked_from_readme
    assert unlinked == set(), f"docs pages the README does not link: {unlinked}"


# ------------------------------------------------------------------------------------------------------------
# the README's commands on a fresh clone

READS_A_RUN = ("sample.py", "spd.py", "export_hf.py")  # they read an out_dir an earlier command trained
# (and `python -m tpcomm.bench.trace` reads a trace an earlier command wrote)


def script_of(words):
    """The script (or -m module) a command runs, past torchrun's and the interpreter's own options."""
    rest = [w for w in words[1:] if w != "..."]
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        rest = rest[1:]
    return (rest[1] if rest[:1] == ["-m"] else rest[0]) if rest else None, rest


# sweeps whose README command exists to add the next chunk to the committed runs (finished runs are skipped,
# never rewritten): gpu-scale, run a GPU window at a time
CONTINUES_COMMITTED = ("gpu-scale",)


def fresh_clone_problems(text):
    """A README command that would fail or touch committed results on a fresh clone, or the second time it
    runs: a train.py run without --overwrite=True or --init_from=resume (refused once its out_dir holds a
    checkpoint); a command reading another's output whose line does not say `needs ...`; a sweep training into
    a directory that holds committed result files without its own --out."""
    lines, problems = text.split("\n"), []
    for line, command, words in extract_commands(text):
        script, rest = script_of(words)
        said = lines[line - 1].partition("#")[2]
        if script == "train.py" and not {"--overwrite=True", "--init_from=resume"} & set(rest):
            problems.append(f"README.md:{line}: train.py without --overwrite=True (a second run is refused)")
        if (script in READS_A_RUN or script == "tpcomm.bench.trace") and "needs" not in said:
            problems.append(f"README.md:{line}: {script} reads an earlier command's output; say `# needs "
                            "...`")
        if script == "experiment.py" and len(rest) > 1 and rest[1] not in ("report",
                                                                           *CONTINUES_COMMITTED) and \
                not any(w.startswith("--out=") for w in rest) and \
                glob.glob(os.path.join(ROOT, "experiments", rest[1], "runs", "*.json")):
            problems.append(f"README.md:{line}: trains into experiments/{rest[1]}, which holds committed "
                            "results")
    return problems


def test_readme_commands_run_on_a_fresh_clone_or_say_what_they_need():
    with open(os.path.join(ROOT, "README.md")) as f:
        problems = fresh_clone_problems(f.read())
    assert not problems, "\n".join(problems)
    # anti-vacuity: each rule catches its case
    bad = "\n".join(["```sh", "python train.py config/train_shakespeare_char_cpu.py", "python sample.py "
                     "--out_dir=out-shakespeare-char", "python experiment.py cpu --seeds=1338", "python -m "
                     "tpcomm.bench.trace summary /tmp/trace/t.json", "```"])
    assert len(fresh_clone_problems(bad)) == 4, fresh_clone_problems(bad)


TRACKER_WORDS = re.compile(r"\b[Ii]ssue \d+|\bnew section\b")


def test_no_doc_or_package_comment_speaks_the_trackers_words():
    """Docs and every Python file's comments and docstrings say what and why; issue numbers and 'new
    section' belong to commit messages."""
    import subprocess

    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True)
    python = listed.stdout.split()
    assert "tpcomm/model/strategies.py" in python and "tests/conftest.py" in python  # the files were listed
    paths = DOC_FILES + [p for p in python if p != "tests/house/test_docs.py"]  # this file plants the words
    found = [f"{p}:{i}" for p in paths for i, line in enumerate(open(os.path.join(ROOT, p), encoding="utf-8"),
                                                                1) if TRACKER_WORDS.search(line)]
    assert found == [], found
    assert TRACKER_WORDS.search("## Collective matmul (issue 48; new section)")  # the check can fail
