"""
Results of a communication sweep, read from the files each run leaves in its out_dir (config.json,
metrics.jsonl, and the runner's done.json); never from wandb, never from a config's name.

    rows = summarize([("24comm", [run_dir_seed1, run_dir_seed2]), ("12comm", [...]), ...])
    write_tables(rows, out_dir)   # results.md, results.csv, results.json
    write_plots(rows, out_dir)    # val_loss_vs_allreduces.png, val_loss_curves.png, tokens_per_s_vs_allreduces.png
    write_paired(rows, out_dir)   # with 2+ seeds: paired.md and paired_difference_vs_tokens.png

`python experiment.py <sweep> --report-only` calls these on a sweep's finished runs. A file that is not what
train.py and the runner write (truncated JSON, a wrong type) raises ResultsError naming the file (and line).
"""

import csv
import itertools
import json
import os
import statistics
import textwrap

SKIP_TRAIN_RECORDS = 2  # the first logged steps include process start-up and warm-up: left out of tokens/s
PLOTS = ("val_loss_vs_allreduces.png", "val_loss_curves.png", "tokens_per_s_vs_allreduces.png")
CSV_COLUMNS = ("config", "config_file", "block_pattern", "tp_size", "tp_mode", "fwd_allreduces", "bwd_allreduces",
               "grad_sync_allreduces", "comm_bytes_per_token", "n_seeds", "seeds", "val_loss_mean", "val_loss_std",
               "val_loss_min", "val_loss_max", "gap_to_baseline", "final_iter", "tokens", "tokens_per_s",
               "comm_seconds_per_iter", "wall_s")


def compact_list(items):
    """The shortest obvious Python expression for a list: ['tp']*12, ['parallel','spd','spd']*4,
    (['parallel']*5+['spd'])*2. It evaluates back to the list (and train.py accepts it as --block_types)."""
    items, n = list(items), len(items)
    period = next(p for p in range(1, n + 1) if n % p == 0 and items[:p] * (n // p) == items)
    unit, reps = items[:period], n // period
    runs = [(k, len(list(g))) for k, g in itertools.groupby(unit)]
    if len(runs) > 1 and any(c >= 3 for _, c in runs):
        expr = "+".join(f"['{k}']*{c}" if c > 1 else f"['{k}']" for k, c in runs)
        expr = f"({expr})" if reps > 1 else expr
    else:
        expr = "[" + ",".join(f"'{k}'" for k in unit) + "]"
    return expr if reps == 1 else f"{expr}*{reps}"


def block_pattern(cfg):
    if cfg.get("model_type", "gpt") != "distributed_gpt":
        return "gpt (no tensor parallelism)"
    types = cfg.get("block_types")
    types = ["tp"] * cfg["n_layer"] if types is None else [types] * cfg["n_layer"] if isinstance(types, str) else types
    return compact_list(types)


class ResultsError(ValueError):
    """A run directory whose files cannot be read as results (corrupt JSON, wrong types): one line naming the file."""


def _read_json(path, default=None):
    """A JSON object from path; default when the file does not exist."""
    if not os.path.exists(path):
        return default
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ResultsError(f"{path}: not readable as JSON ({e})") from None
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# metrics.jsonl fields this module reads, and what they must hold when present (None: not measured)
INT_FIELDS = ("fwd_allreduces", "bwd_allreduces", "grad_sync_allreduces")
NUMBER_FIELDS = ("val_loss", "tokens_per_s", "comm_bytes_per_token", "comm_seconds")


def _check_record(r, where):
    if not isinstance(r, dict):
        raise ResultsError(f"{where}: expected a JSON object, got {type(r).__name__}")
    if not (isinstance(r.get("iter"), int) and not isinstance(r["iter"], bool) and r["iter"] >= 0):
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
        # a new process (resume) starts logging at or before the previous record's iter; an eval record and then
        # the train record of the same iter is the normal order
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
    """One value measured on every logged step; a run whose count changed mid-way is an error, not an average."""
    values = {r[key] for r in train if r.get(key) is not None}
    if len(values) > 1:
        raise ResultsError(f"{run_dir}: {key} changed during the run: {sorted(values)}")
    return values.pop() if values else None


def summarize_run(run_dir):
    """Numbers of one finished run (one seed)."""
    cfg_path = os.path.join(run_dir, "config.json")
    cfg = _read_json(cfg_path)
    if cfg is None:
        raise ResultsError(f"{run_dir}: no config.json (is this a train.py out_dir?)")
    for key in ("seed", "batch_size", "block_size", "gradient_accumulation_steps", "max_iters"):
        if not (isinstance(cfg.get(key), int) and not isinstance(cfg.get(key), bool)):
            raise ResultsError(f"{cfg_path}: {key!r} must be an int, got {cfg.get(key)!r}")
    evals, train = read_metrics(run_dir)
    if not evals:
        raise ResultsError(f"{os.path.join(run_dir, 'metrics.jsonl')}: no eval record (val_loss)")
    # each process's first steps include its start-up and warm-up (a resumed run has two such starts)
    steady = [r for r in train if r["_seg_pos"] >= SKIP_TRAIN_RECORDS]
    steady = steady or train  # a run too short to have steady steps: all of them
    done_path = os.path.join(run_dir, "done.json")
    done = _read_json(done_path, {})
    wall_s, config_file = done.get("wall_s"), done.get("config_file", "")
    if not (wall_s is None or _is_number(wall_s)) or not isinstance(config_file, str):
        raise ResultsError(f"{done_path}: wall_s must be a number and config_file a string, got "
                           f"{wall_s!r}, {config_file!r}")

    def med(key):
        values = [r[key] for r in steady if r.get(key) is not None]
        return statistics.median(values) if values else None

    return dict(
        run_dir=run_dir, seed=cfg["seed"], cfg=cfg, config_file=config_file,
        val_loss=evals[-1]["val_loss"], final_iter=evals[-1]["iter"],
        curve=[(r["iter"], r["val_loss"]) for r in evals],
        fwd_allreduces=_measured(train, "fwd_allreduces", run_dir),
        bwd_allreduces=_measured(train, "bwd_allreduces", run_dir),
        grad_sync_allreduces=_measured(train, "grad_sync_allreduces", run_dir),
        comm_bytes_per_token=med("comm_bytes_per_token"), comm_seconds=med("comm_seconds"),
        tokens_per_s=med("tokens_per_s"), wall_s=wall_s,
        tokens=cfg["batch_size"] * cfg["block_size"] * cfg["gradient_accumulation_steps"] * cfg["max_iters"],
    )


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def _std(xs):
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def summarize(groups):
    """One row per config from [(label, [run_dir per seed, ...]), ...]. The baseline is the row with the
    most measured forward all-reduces (the all-'tp' model); the gap is mean val loss minus the baseline's."""
    rows = []
    for label, run_dirs in groups:
        runs = [summarize_run(d) for d in run_dirs]
        if not runs:
            continue
        first, losses = runs[0], [r["val_loss"] for r in runs]
        for key in ("fwd_allreduces", "bwd_allreduces", "final_iter", "tokens"):
            if len({r[key] for r in runs}) > 1:
                raise ResultsError(f"{label}: seeds disagree on {key}: {[r[key] for r in runs]}")
        rows.append(dict(
            config=label, config_file=first["config_file"], block_pattern=block_pattern(first["cfg"]),
            tp_size=first["cfg"].get("tp_size"), tp_mode=first["cfg"].get("tp_mode"),
            fwd_allreduces=first["fwd_allreduces"], bwd_allreduces=first["bwd_allreduces"],
            grad_sync_allreduces=first["grad_sync_allreduces"], comm_bytes_per_token=first["comm_bytes_per_token"],
            n_seeds=len(runs), seeds=[r["seed"] for r in runs], val_loss_per_seed=losses,
            val_loss_mean=statistics.fmean(losses), val_loss_std=_std(losses),
            val_loss_min=min(losses), val_loss_max=max(losses), final_iter=first["final_iter"],
            tokens=first["tokens"], tokens_per_s=_mean(r["tokens_per_s"] for r in runs),
            tokens_per_s_std=_std([r["tokens_per_s"] for r in runs if r["tokens_per_s"] is not None]),
            comm_seconds_per_iter=_mean(r["comm_seconds"] for r in runs), wall_s=_mean(r["wall_s"] for r in runs),
            curves=[r["curve"] for r in runs], run_dirs=[r["run_dir"] for r in runs],
            cfg_max_iters=first["cfg"]["max_iters"],
        ))
    measured = [r for r in rows if r["fwd_allreduces"] is not None]
    base = max(measured, key=lambda r: r["fwd_allreduces"]) if measured else None
    for r in rows:
        r["baseline"] = base["config"] if base else None
        r["gap_to_baseline"] = r["val_loss_mean"] - base["val_loss_mean"] if base else None
    return rows


def _fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def markdown_table(rows):
    base = next((r for r in rows if r["config"] == r["baseline"]), None)
    gap = f"gap to {base['fwd_allreduces']}-sync baseline" if base else "gap to baseline"
    n_seeds = max((r["n_seeds"] for r in rows), default=0)
    lines = [f"| config | block pattern | fwd all-reduces | bwd all-reduces | final val loss "
             f"({'mean ± std' if n_seeds > 1 else 'one seed'}) | min–max | seeds | {gap} | tokens/s | wall time (s) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        loss = _fmt(r["val_loss_mean"], ".4f") + (f" ± {r['val_loss_std']:.4f}" if r["n_seeds"] > 1 else "")
        spread = f"{r['val_loss_min']:.4f}–{r['val_loss_max']:.4f}" if r["n_seeds"] > 1 else "—"
        lines.append(f"| {r['config_file'] or r['config']} | `{r['block_pattern']}` | {_fmt(r['fwd_allreduces'], 'd')}"
                     f" | {_fmt(r['bwd_allreduces'], 'd')} | {loss} | {spread} | {r['n_seeds']} | "
                     f"{_fmt(r['gap_to_baseline'], '+.4f')} | {_fmt(r['tokens_per_s'], ',.0f')} | "
                     f"{_fmt(r['wall_s'], '.1f')} |")
    return "\n".join(lines)


def write_tables(rows, out_dir, *, title="Communication sweep", note=""):
    """results.md, results.csv and results.json in out_dir; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, f"results.{ext}") for ext in ("md", "csv", "json")]
    tokens = sorted({r["tokens"] for r in rows})
    with open(paths[0], "w") as f:
        f.write(f"# {title}\n\n" + (f"{note}\n\n" if note else ""))
        f.write(f"Tokens per run (batch x block x accumulation x iters): {', '.join(f'{t:,}' for t in tokens)}. "
                f"All-reduces are measured per forward/backward pass by counting f/g calls. Final val loss is "
                f"the last eval record (iter {', '.join(str(i) for i in sorted({r['final_iter'] for r in rows}))}); "
                f"tokens/s is the median over logged steps (the first {SKIP_TRAIN_RECORDS} of each process skipped: "
                f"start-up, and a resumed run's restart); wall time "
                f"is per run, start-up and evals included.\n\n")
        f.write(markdown_table(rows) + "\n")
    with open(paths[1], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(dict(r, seeds=" ".join(map(str, r["seeds"]))))
    with open(paths[2], "w") as f:
        json.dump([{k: v for k, v in r.items() if k != "curves"} for r in rows], f, indent=2)
    return paths


def write_plots(rows, out_dir, *, title="Communication sweep", note=""):
    """The three PNGs in out_dir; returns their paths. `note` (e.g. the overrides) goes under each title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, name) for name in PLOTS]
    rows = [r for r in rows if r["fwd_allreduces"] is not None]
    rows = sorted(rows, key=lambda r: -r["fwd_allreduces"])
    base = next((r for r in rows if r["config"] == r["baseline"]), None)
    n_seeds = max((r["n_seeds"] for r in rows), default=1)
    seeds_txt = f"{n_seeds} seeds, error bars: std" if n_seeds > 1 else "1 seed"
    tokens = rows[0]["tokens"] if rows else 0
    xs = [r["fwd_allreduces"] for r in rows]
    sim = all(r["tp_mode"] == "simulated" for r in rows)
    tp_txt = f"tp_size={rows[0]['tp_size']} {'simulated' if sim else 'real'}" if rows else ""
    note = "\n".join(textwrap.wrap(note, 110))
    note = f"\n{note}" if note else ""

    # 1. final val loss vs forward all-reduces, baseline marked
    fig, ax = plt.subplots(figsize=(9, 5.5))
    ax.errorbar(xs, [r["val_loss_mean"] for r in rows], yerr=[r["val_loss_std"] for r in rows], fmt="o-",
                color="tab:blue", capsize=4, label="final val loss")
    if base:
        ax.axhline(base["val_loss_mean"], color="tab:red", ls="--", lw=1,
                   label=f"baseline {base['block_pattern']}: {base['val_loss_mean']:.3f}")
        ax.plot([base["fwd_allreduces"]], [base["val_loss_mean"]], "*", color="tab:red", ms=16, zorder=5)
        for r in rows:
            if r is base:
                continue
            ax.annotate(f"{r['gap_to_baseline']:+.3f}", (r["fwd_allreduces"], r["val_loss_mean"]),
                        textcoords="offset points", xytext=(0, 9), ha="center", fontsize=8, color="0.3")
    ax.set_xticks(sorted(set(xs)))
    ax.margins(y=0.12)
    ax.set_xlabel("forward all-reduces per forward pass (measured)")
    ax.set_ylabel("final validation loss (nats/token)")
    ax.set_title(f"{title}: final val loss vs communication\n{tp_txt}, {tokens:,} tokens per run, {seeds_txt}; "
                 f"labels: gap to baseline{note}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)

    # 2. val loss curves, one per config (mean over seeds), colored by communication count
    fig, ax = plt.subplots(figsize=(12, 5.5))
    cmap = plt.get_cmap("plasma")  # spaced by rank, so neighbouring counts stay distinguishable
    lows, highs, starts = [], [], []
    for rank, r in enumerate(rows):
        iters = sorted({i for c in r["curves"] for i, _ in c})
        per_iter = {i: [v for c in r["curves"] for j, v in c if j == i] for i in iters}
        mean = [statistics.fmean(per_iter[i]) for i in iters]
        is_base = base is not None and r is base
        ax.plot(iters, mean, "o-" if len(iters) < 30 else "-", ms=3, lw=2.2 if is_base else 1.3,
                color="black" if is_base else cmap(0.9 * rank / max(1, len(rows) - 1)),
                label=f"{r['fwd_allreduces']:>2} all-reduces  {r['block_pattern']}")
        lows.append(min(mean))
        highs.extend(mean[1:2] or mean)  # zoom past the start: iter 0 is ~ln(vocab) for every run
        starts.append(iters[:2])
    if rows:
        ax.set_ylim(min(lows) - 0.05, max(highs) + 0.1)
        first = min(starts)
        if len(first) == 2:
            ax.set_xlim(left=first[1] - 0.25 * (first[1] - first[0]))
    ax.set_xlabel("iteration")
    ax.set_ylabel("validation loss (nats/token)" + (" (mean over seeds)" if n_seeds > 1 else ""))
    curve_seeds = f"mean over {n_seeds} seeds" if n_seeds > 1 else "1 seed"
    ax.set_title(f"{title}: validation loss during training\n{tp_txt}, {tokens:,} tokens per run, {curve_seeds}\n"
                 f"(zoomed past iter 0, where every run is at ~ln(vocab)){note}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(title="forward all-reduces, block pattern", title_fontsize=9, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), prop={"family": "monospace", "size": 8})
    fig.tight_layout()
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)

    # 3. throughput vs forward all-reduces
    fig, ax = plt.subplots(figsize=(9, 5.5))
    ax.errorbar(xs, [r["tokens_per_s"] for r in rows], yerr=[r["tokens_per_s_std"] for r in rows], fmt="o-",
                color="tab:green", capsize=4, label="tokens/s (median over steps)")
    if base and base["tokens_per_s"]:
        ax.plot([base["fwd_allreduces"]], [base["tokens_per_s"]], "*", color="tab:red", ms=16, zorder=5,
                label="baseline")
    ax.set_xticks(sorted(set(xs)))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("forward all-reduces per forward pass (measured)")
    ax.set_ylabel("training throughput (tokens/s per model replica)")
    sim_note = ("simulated TP: one process computes every shard, the all-reduces are in-memory sums,\n"
            "so this shows compute differences between block types, not communication savings") if sim else \
        "real TP: all-reduces cross process boundaries"
    ax.set_title(f"{title}: throughput vs communication ({tp_txt})\n{sim_note}{note}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(paths[2], dpi=120)
    plt.close(fig)
    return paths


# ---------- paired comparison with the baseline (same seed: same initial weights, same batches) ----------

# two-sided 95% quantiles of Student's t for 1..10 degrees of freedom (standard tables); 1.96 beyond
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
FLAT_FRACTION, FLAT_THRESHOLD = 0.2, 0.01  # flat: the val loss improved < 1% over the last fifth of training


def mean_ci(xs):
    """(mean, half-width of its 95% confidence interval by Student's t); half-width None for one value."""
    if len(xs) < 2:
        return statistics.fmean(xs), None
    t = T_975[len(xs) - 2] if len(xs) - 1 <= len(T_975) else 1.96
    return statistics.fmean(xs), t * statistics.stdev(xs) / len(xs) ** 0.5


def _by_seed(row):
    """{seed: {iter: val_loss}} of a summarized row."""
    return {seed: dict(curve) for seed, curve in zip(row["seeds"], row["curves"])}


def paired(rows):
    """Per config: the differences config - baseline of the val loss on the seeds both ran, at every eval iteration
    they share: {'final': (mean, ci, per-seed list), 'curve': [(iter, mean, ci)]}. The baseline's own is zero."""
    base = next((r for r in rows if r["config"] == r["baseline"]), None)
    if base is None:
        return {}
    ref = _by_seed(base)
    out = {}
    for r in rows:
        mine = _by_seed(r)
        seeds = sorted(set(mine) & set(ref))
        iters = sorted(set.intersection(*(set(mine[s]) & set(ref[s]) for s in seeds))) if seeds else []
        if not iters:
            continue
        diff = {i: [mine[s][i] - ref[s][i] for s in seeds] for i in iters}
        final = diff[iters[-1]]
        out[r["config"]] = dict(seeds=seeds, final=(*mean_ci(final), final),
                                curve=[(i, *mean_ci(diff[i])) for i in iters])
    return out


def ordering(curve, tokens_per_iter):
    """Where a config's paired difference is below the baseline's (CI entirely < 0), above (> 0) or tied (the CI
    holds 0), as segments over training: 'lower 250-2000 (0.19M-1.5M tokens); tied 2250-5000 (...)'."""
    def verdict(mean, ci):
        if ci is None:
            return "lower" if mean < 0 else "higher" if mean > 0 else "tied"
        return "lower" if mean + ci < 0 else "higher" if mean - ci > 0 else "tied"

    segments = []
    for i, mean, ci in curve:
        if i == 0:
            continue  # every run is at ~ln(vocab) before its first step
        v = verdict(mean, ci)
        if segments and segments[-1][0] == v:
            segments[-1][2] = i
        else:
            segments.append([v, i, i])
    return "; ".join(f"{v} {a}-{b} ({a * tokens_per_iter / 1e6:.2f}M-{b * tokens_per_iter / 1e6:.2f}M tokens)"
                     for v, a, b in segments)


def flatness(row):
    """(relative improvement of the mean val loss over the last FLAT_FRACTION of training, iters compared)."""
    curves = row["curves"]
    iters = sorted(set.intersection(*(set(i for i, _ in c) for c in curves)))
    last = iters[-1]
    start = min((i for i in iters if i >= (1 - FLAT_FRACTION) * last), default=last)
    at = {i: statistics.fmean(dict(c)[i] for c in curves) for i in (start, last)}
    return (at[start] - at[last]) / at[start], (start, last)


def paired_markdown(rows, *, early_iter=500):
    """The paired table, the baseline's flatness and the ordering over training, as markdown."""
    pairs = paired(rows)
    base = next(r for r in rows if r["config"] == r["baseline"])
    tokens_per_iter = base["tokens"] / base["cfg_max_iters"]
    improvement, (a, b) = flatness(base)
    lines = [f"Paired with the baseline `{base['block_pattern']}` seed by seed (same seed: same initial weights, "
             f"same batches); differences config - baseline in validation loss (nats/token), mean and 95% confidence "
             f"interval (Student's t over the {len(pairs[base['config']]['seeds'])} seeds).", "",
             f"Baseline flatness: its mean val loss fell {100 * improvement:.2f}% over the last fifth of training "
             f"(iter {a} -> {b}); criterion for flat: under {100 * FLAT_THRESHOLD:.0f}%: "
             f"{'met' if improvement < FLAT_THRESHOLD else 'NOT met'}.", "",
             f"| config | block pattern | fwd all-reduces | final val loss | final difference [95% CI] | per seed | "
             f"difference at iter {early_iter} [95% CI] | ordering over training (vs baseline) |",
             "|---|---|---:|---:|---:|---|---:|---|"]
    for r in rows:
        p = pairs.get(r["config"])
        if p is None or r is base:
            continue
        mean, ci, per_seed = p["final"]
        early = next(((m, c) for i, m, c in p["curve"] if i == early_iter), None)
        fmt = (lambda m, c: f"{m:+.4f}" + (f" [{m - c:+.4f}, {m + c:+.4f}]" if c is not None else ""))
        loss = f"{r['val_loss_mean']:.4f}" + (f" ± {r['val_loss_std']:.4f}" if r["n_seeds"] > 1 else "")
        lines.append(f"| {r['config']} | `{r['block_pattern']}` | {_fmt(r['fwd_allreduces'], 'd')} | "
                     f"{loss} | {fmt(mean, ci)} | "
                     f"{', '.join(f'{d:+.4f}' for d in per_seed)} | {fmt(*early) if early else 'n/a'} | "
                     f"{ordering(p['curve'], tokens_per_iter)} |")
    return "\n".join(lines)


def write_paired(rows, out_dir, *, title="Communication sweep"):
    """paired.md and paired_difference_vs_tokens.png when the baseline and another config have 2+ common seeds;
    returns their paths ([] otherwise)."""
    pairs = paired(rows)
    base = next((r for r in rows if r["config"] == r["baseline"]), None)
    if base is None or not any(len(p["seeds"]) > 1 for c, p in pairs.items() if c != base["config"]):
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    md, png = os.path.join(out_dir, "paired.md"), os.path.join(out_dir, "paired_difference_vs_tokens.png")
    with open(md, "w") as f:
        f.write(f"# {title}: paired differences to the baseline\n\n{paired_markdown(rows)}\n")
    tokens_per_iter = base["tokens"] / base["cfg_max_iters"]
    fig, ax = plt.subplots(figsize=(10, 5.5))
    ax.axhline(0, color="black", lw=1.5, label=f"baseline {base['block_pattern']}")
    cmap = plt.get_cmap("plasma")
    others = sorted((r for r in rows if r is not base and r["config"] in pairs), key=lambda r: -r["fwd_allreduces"])
    for k, r in enumerate(others):
        curve = [(i, m, c or 0.0) for i, m, c in pairs[r["config"]]["curve"] if i > 0]
        x = [i * tokens_per_iter / 1e6 for i, _, _ in curve]
        mean = [m for _, m, _ in curve]
        color = cmap(0.85 * k / max(1, len(others) - 1))
        ax.plot(x, mean, "o-", ms=3, color=color, label=f"{r['fwd_allreduces']} all-reduces {r['block_pattern']}")
        ax.fill_between(x, [m - c for _, m, c in curve], [m + c for _, m, c in curve], color=color, alpha=0.2)
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("val loss minus the baseline's, same seed (nats/token)")
    ax.set_title(f"{title}: paired difference to the baseline during training\nmean over "
                 f"{len(pairs[base['config']]['seeds'])} seeds, band: 95% confidence interval; below 0 = better "
                 f"than the baseline", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", prop={"family": "monospace", "size": 8})
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return [md, png]
