"""
The communication sweep, this repo's main experiment: train one config per communication budget, all at one
token budget, one run after another; then write a results table and plots from the runs' metrics files.

$ python experiment.py cpu                             # Shakespeare-char, 10 budgets, ~8 min on 2 CPU cores
$ python experiment.py cpu --seeds=1337,1338,1339      # more seeds (finished runs are skipped, not redone)
$ python experiment.py cpu --max_iters=20 --eval_interval=10 --lr_decay_iters=20   # quick try, own directory
$ python experiment.py cpu --report-only               # table and plots again from the finished runs
$ python experiment.py gpt2 --nproc=8                  # GPT-2 124M on OpenWebText, 20k steps per run (GPUs)
$ python experiment.py cpu-real                        # real TP over 2 processes (gloo): does wall time drop?
$ python experiment.py cpu-long --seeds=1337,1338,1339  # 4 patterns trained 10x longer (~100 min, 1 free core)
$ python experiment.py gpt2 --counts                   # measured all-reduces and bytes/token of each config

Runner options: --seeds=S1,S2  --nproc=N (torchrun when > 1)  --out=DIR  --report-only  --dry-run  --counts.
Every other --key=value goes to train.py (and names the sweep directory, so a quick try never touches the
real runs). Runs live in experiments/<sweep>[+overrides]/<run>-seed<S>/ with train.py's config.json and
metrics.jsonl, the run's train.log (written line by line as train.py prints, so it is complete up to a kill),
and done.json once it finished; a run without a readable done.json (interrupted) is started again from scratch,
or, when its config checkpoints at every eval (always_save_checkpoint, as cpu-long), goes on from its ckpt.pt.
Ctrl-C or kill stops the sweep and its train.py. A sweep holds a lock on its directory while it runs: a second
sweep there refuses to start. Results: results.md/.csv/.json and three PNGs in the sweep directory; with 2+
seeds also paired.md and paired_difference_vs_tokens.png (differences to the baseline seed by seed, 95% CIs). Runner options and every run's train.py config are
checked before the first run starts; a user error (a bad value, a corrupt metrics file of a finished run, a
locked directory) is one line naming it, exit status 2.
"""

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from tpcomm import results
from configurator import ConfigError

from tpcomm import ROOT
RUNNER_OPTIONS = ("seeds", "nproc", "out", "report-only", "dry-run", "counts")


@dataclass(frozen=True)
class Run:
    """One point of a sweep: a train.py config file plus its own --key=value overrides."""
    name: str  # e.g. '24comm'; run directories are <name>-seed<S>
    config: str  # relative to the repo root
    overrides: tuple = ()
    nproc: int = 1  # processes per run (torchrun when > 1)


def comm_runs(pattern, budgets, *, overrides=(), nproc=1):
    return [Run(f"{n}comm", pattern.format(n), tuple(overrides), nproc) for n in budgets]


SWEEPS = {
    # the six SPEC budgets plus lower ones; CPU scale, one token budget, ~45 s per run on 2 cores
    "cpu": comm_runs("config/train_shakespeare_char_{}comm.py", (24, 18, 16, 12, 8, 6, 4, 3, 2, 1)),
    # GPT-2 124M on OpenWebText, 20k steps (~9.8B tokens) per run: for a GPU node (--nproc=8)
    "gpt2": comm_runs("config/train_gpt2_{}comm.py", (24, 18, 16, 12, 8, 6)),
    # the CPU configs with real tensor parallelism: 2 processes, one shard each, all-reduces through gloo
    "cpu-real": comm_runs("config/train_shakespeare_char_{}comm.py", (24, 18, 16, 12, 8, 6, 4, 3, 2, 1),
                          overrides=("--tp_size=2", "--tp_mode=real"), nproc=2),
    # past the early phase: four 12-layer patterns (all tp, all spd, half parallel, all parallel) trained 10x longer
    # than "cpu", evaluated every 250 steps; checkpoints every eval, so an interrupted run resumes. ~8 min a run on
    # one free core
    "cpu-long": comm_runs("config/train_shakespeare_char_{}comm.py", (24, 12, 6, 1),
                          overrides=("--max_iters=5000", "--lr_decay_iters=5000", "--eval_interval=250",
                                     "--eval_iters=50", "--always_save_checkpoint=True")),
}


class SweepError(ValueError):
    """A sweep that must not start (bad overrides, unequal token budgets, missing data): one line, exit 2."""


@dataclass
class Job:
    run: Run
    seed: int
    out_dir: str
    args: list  # train.py arguments
    cfg: dict  # train.py's resolved config for these arguments
    nproc: int

    @property
    def label(self):
        return f"{self.run.name}-seed{self.seed}"


def sweep_dir_for(sweep, overrides, root="experiments"):
    """experiments/<sweep>, or experiments/<sweep>+<overrides> so a quick try never touches the real runs."""
    if not overrides:
        return os.path.join(root, sweep)
    slug = re.sub(r"[^A-Za-z0-9._=,+-]+", "_", "+".join(o.lstrip("-") for o in overrides))
    if len(slug) > 80:
        slug = slug[:68] + "-" + hashlib.sha1(slug.encode()).hexdigest()[:8]
    return os.path.join(root, f"{sweep}+{slug}")


def _normal(cfg):
    return json.loads(json.dumps(cfg))  # as config.json/done.json will hold it (tuples become lists)


def plan(runs, *, sweep_dir, seeds, overrides=(), nproc=None, check_data=True):
    """Resolve every run's train.py config and check the sweep before any work: configs load, data exists,
    processes fit the layout, and every run trains on the same number of tokens."""
    from configurator import configure
    from train import DEFAULTS

    jobs = []
    for seed in seeds:  # seed-major: an unfinished sweep holds whole seeds of every config
        for run in runs:
            out_dir = os.path.join(sweep_dir, f"{run.name}-seed{seed}")
            args = [os.path.join(ROOT, run.config), *run.overrides, f"--seed={seed}", f"--out_dir={out_dir}",
                    f"--wandb_run_name={os.path.basename(sweep_dir)}-{run.name}-seed{seed}", *overrides]
            try:
                cfg = configure(DEFAULTS, args)
                check_train_config(cfg)
            except ConfigError as e:
                raise SweepError(f"{run.name}: {e}") from None
            n = nproc or run.nproc
            if cfg["tp_mode"] == "real" and n == 1:
                n = cfg["tp_size"]
            tp = cfg["tp_size"] if cfg["tp_mode"] == "real" else 1
            if n % tp or cfg["gradient_accumulation_steps"] % (n // tp):
                raise SweepError(f"{run.name}: nproc ({n}) must be dp x tp with tp = {tp} and "
                                 f"gradient_accumulation_steps ({cfg['gradient_accumulation_steps']}) divisible by dp")
            jobs.append(Job(run, seed, out_dir, args, _normal(cfg), n))
    check_token_budget(jobs)
    data_dirs = {j.cfg["data_dir"] or os.path.join(ROOT, "data", j.cfg["dataset"]) for j in jobs}
    for data_dir in sorted(data_dirs) if check_data else ():
        for split in ("train", "val"):
            if not os.path.isfile(os.path.join(data_dir, f"{split}.bin")):
                raise SweepError(f"data file {os.path.join(data_dir, split + '.bin')} not found (run python "
                                 f"data/{os.path.basename(data_dir)}/prepare.py, or pass --data_dir=...)")
    return jobs


def check_train_config(cfg):
    """train.py's own checks that need no data, no checkpoint and no torchrun, so that a sweep with a bad override
    (--eval_interval=0) stops before its first run. Raises ConfigError naming key and value."""
    import train

    for key, default in train.DEFAULTS.items():  # configure() lets None through for any key (--batch_size=None)
        if isinstance(default, (int, float)) and not isinstance(default, bool) and \
                (not isinstance(cfg[key], (int, float)) or isinstance(cfg[key], bool)):
            raise ConfigError(f"{key} must be a number, got {cfg[key]!r}")
    if cfg["init_from"] == "resume":
        raise ConfigError("init_from='resume': the runner starts every run from scratch (a finished run is skipped)")
    if cfg["tp_mode"] not in ("simulated", "real"):  # train.py checks these with the launch and the device
        raise ConfigError(f"tp_mode must be 'simulated' or 'real', got {cfg['tp_mode']!r}")
    if cfg["dtype"] not in ("auto", "float32", "bfloat16", "float16"):
        raise ConfigError(f"dtype must be 'auto', 'float32', 'bfloat16' or 'float16', got {cfg['dtype']!r}")
    train.check_settings(cfg)
    train.check_model(cfg)


def tokens_of(cfg):
    return cfg["batch_size"] * cfg["block_size"] * cfg["gradient_accumulation_steps"] * cfg["max_iters"]


def check_token_budget(jobs):
    budgets = {j.run.name: tokens_of(j.cfg) for j in jobs}
    if len(set(budgets.values())) > 1:
        detail = ", ".join(f"{name}={t:,}" for name, t in budgets.items())
        raise SweepError(f"runs of one sweep must train on the same tokens (batch_size*block_size*"
                         f"gradient_accumulation_steps*max_iters), got {detail}")
    for j in jobs:
        if j.cfg["max_iters"] % j.cfg["eval_interval"]:
            print(f"warning: {j.run.name}: max_iters ({j.cfg['max_iters']}) is not a multiple of eval_interval "
                  f"({j.cfg['eval_interval']}); the 'final' val loss is the one at the last eval before it")
            break


def read_done(out_dir):
    """The run's done.json, or None when it is missing or unreadable. The runner writes done.json last, atomically,
    after train.py succeeded; one that is not a JSON object with a non-empty 'config' object (truncated, edited,
    from elsewhere) marks no finished run, so the run is redone rather than reported from unknown files."""
    try:
        with open(os.path.join(out_dir, "done.json")) as f:
            done = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(done, dict) or not isinstance(done.get("config"), dict) or not done["config"]:
        return None
    return done


def is_finished(job):
    """A valid done.json records this run's config: a changed config value makes the run stale (keys that
    train.py gained or lost since are ignored)."""
    done = read_done(job.out_dir)
    return done is not None and all(done["config"][k] == v for k, v in job.cfg.items() if k in done["config"])


def command(job):
    """train.py by absolute path, run from the current directory (out_dir and --data_dir are relative to it)."""
    train_py = os.path.join(ROOT, "train.py")
    if job.nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={job.nproc}",
                train_py, *job.args]
    return [sys.executable, train_py, *job.args]


def shown(cmd):
    """A command as a user would type it in the repo root."""
    return " ".join(["python"] + [os.path.relpath(a, ROOT) if a.startswith(ROOT + os.sep) else a for a in cmd[1:]])


STEP_LINE = re.compile(r"^(?:iter|step) (\d+):")


def resumable(job):
    """An interrupted run of a sweep that checkpoints at every eval (always_save_checkpoint) goes on from its
    ckpt.pt; any other leftover directory is removed and the run starts from scratch."""
    return job.cfg.get("always_save_checkpoint", False) and os.path.isfile(os.path.join(job.out_dir, "ckpt.pt"))


def run_job(job, *, bar=None):
    """Run train.py (from scratch, or from the run's own checkpoint when resumable), tee its output to train.log,
    and mark success with done.json. Raises RuntimeError with the log's tail when train.py fails."""
    resume = resumable(job)
    if not resume:
        if os.path.exists(job.out_dir):
            shutil.rmtree(job.out_dir)
        os.makedirs(job.out_dir)
    cmd = command(job) + (["--init_from=resume"] if resume else [])
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if job.nproc > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // job.nproc))
    log_path = os.path.join(job.out_dir, "train.log")
    t0 = time.time()
    with open(log_path, "a" if resume else "w", buffering=1) as log:  # line-buffered: complete up to a kill
        log.write(shown(cmd) + "\n")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1)
        try:
            for line in proc.stdout:
                log.write(line)
                m = STEP_LINE.match(line)
                if m and bar is not None:
                    bar.n = min(int(m.group(1)) + 1, bar.total)
                    bar.refresh()
            proc.wait()
        except BaseException:  # Ctrl-C: stop train.py too; no done.json, so the next invocation redoes it
            proc.terminate()
            proc.wait()
            raise
    if proc.returncode != 0:
        with open(log_path) as f:
            tail = "".join(f.readlines()[-15:])
        raise RuntimeError(f"{job.label} failed (exit {proc.returncode}); log: {log_path}\n{tail}")
    done = dict(config=job.cfg, config_file=os.path.basename(job.run.config), command=shown(command(job)),
                nproc=job.nproc, wall_s=time.time() - t0, finished=time.strftime("%Y-%m-%d %H:%M:%S"))
    with open(os.path.join(job.out_dir, "done.json.tmp"), "w") as f:
        json.dump(done, f, indent=2)
    os.replace(os.path.join(job.out_dir, "done.json.tmp"), os.path.join(job.out_dir, "done.json"))
    return done


def stop_on_sigterm(signum, frame):
    """kill PID stops a sweep as Ctrl-C does: train.py is stopped too (a background job ignores SIGINT)."""
    raise KeyboardInterrupt(f"signal {signum}")


def run_sweep(jobs, *, desc="sweep"):
    """Run the unfinished jobs one after another, with progress bars; finished ones are skipped."""
    from tqdm import tqdm

    signal.signal(signal.SIGTERM, stop_on_sigterm)

    with tqdm(total=len(jobs), desc=desc, unit="run", position=0, dynamic_ncols=True) as runs_bar:
        for job in jobs:
            done_path = os.path.join(job.out_dir, "done.json")
            if is_finished(job):
                tqdm.write(f"skip {job.label}: already finished ({done_path})")
            else:
                if os.path.exists(done_path) and read_done(job.out_dir) is None:
                    tqdm.write(f"redo {job.label}: {done_path} is not a valid done.json")
                with tqdm(total=job.cfg["max_iters"] + 1, desc=job.label, unit="it", position=1, leave=False,
                          dynamic_ncols=True) as bar:
                    done = run_job(job, bar=bar)
                summary = results.summarize_run(job.out_dir)
                tqdm.write(f"done {job.label}: val loss {summary['val_loss']:.4f} at iter {summary['final_iter']}, "
                           f"fwd all-reduces {summary['fwd_allreduces']}, {done['wall_s']:.0f} s")
            runs_bar.update(1)


def finished_seeds(sweep_dir, runs):
    """Seeds with a run directory in sweep_dir, so the report covers seeds added by earlier invocations."""
    names = {r.name for r in runs}
    seeds = set()
    if os.path.isdir(sweep_dir):
        for d in os.listdir(sweep_dir):
            m = re.fullmatch(r"(.+)-seed(\d+)", d)
            if m and m.group(1) in names:
                seeds.add(int(m.group(2)))
    return seeds


def report(jobs, sweep_dir, *, title, note=""):
    """Tables and plots from the finished jobs; returns (markdown table, plot paths)."""
    groups = {}
    for j in jobs:
        groups.setdefault(j.run.name, [])
        if is_finished(j):
            groups[j.run.name].append(j.out_dir)
    missing = [name for name, dirs in groups.items() if not dirs]
    if missing:
        print(f"no finished runs yet for: {', '.join(missing)}")
    try:
        rows = results.summarize([(name, dirs) for name, dirs in groups.items() if dirs])
    except results.ResultsError as e:  # a finished run's files are corrupt: name the file, no traceback
        raise SweepError(f"cannot report {sweep_dir}: {e}") from None
    if not rows:
        raise SweepError(f"no finished runs in {sweep_dir}")
    results.write_tables(rows, sweep_dir, title=title, note=note)
    plots = results.write_plots(rows, sweep_dir, title=title, note=note)
    paired = results.write_paired(rows, sweep_dir, title=title)
    if paired:  # 2+ seeds: the paired comparison with the baseline
        plots.append(paired[1])
        return results.markdown_table(rows) + "\n\n" + results.paired_markdown(rows), plots
    return results.markdown_table(rows), plots


def comm_counts(jobs, *, tokens=64):
    """Markdown table of each config's collectives, measured by one forward+backward pass on CPU (fp32, and
    bf16 under autocast) of the config's own model: all-reduces per pass and bytes per token per rank."""
    import torch

    from tpcomm.models import build_model

    lines = ["| config | block pattern | tp_size | fwd all-reduces | bwd all-reduces | bytes/token fp32 | "
             "bytes/token bf16 |", "|---|---|---:|---:|---:|---:|---:|"]
    for j in jobs:
        torch.manual_seed(0)
        # the vocabulary never enters the communication (embeddings and lm_head are replicated)
        model = build_model(j.cfg["model_type"], dict(j.cfg, dropout=0.0, vocab_size=50304))
        idx = torch.randint(50304, (1, min(tokens, j.cfg["block_size"])))
        fp32 = model.comm_per_forward(idx)
        if not fp32:  # the model ran no collective (GPT)
            raise SweepError(f"{j.run.name}: model_type={j.cfg['model_type']!r} has no tensor-parallel communication")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = model.comm_per_forward(idx)
        lines.append(f"| {os.path.basename(j.run.config)} | `{results.block_pattern(j.cfg)}` | {j.cfg['tp_size']} | "
                     f"{fp32['fwd_allreduces']} | {fp32['bwd_allreduces']} | {fp32['comm_bytes_per_token']:,.0f} | "
                     f"{bf16['comm_bytes_per_token']:,.0f} |")
    return "\n".join(lines)


def parse_args(argv):
    """Split argv into (sweep name, runner options, train.py overrides)."""
    sweep, opts, overrides = None, {}, []
    for arg in argv:
        key = arg[2:].split("=", 1)[0] if arg.startswith("--") else None
        if key is None:
            if sweep is not None:
                raise SweepError(f"one sweep at a time, got {sweep!r} and {arg!r}")
            sweep = arg
        elif key in RUNNER_OPTIONS:
            opts[key] = arg.split("=", 1)[1] if "=" in arg else True
        elif "=" in arg:
            overrides.append(arg)
        else:
            raise SweepError(f"argument {arg!r}: runner options are {', '.join('--' + o for o in RUNNER_OPTIONS)}; "
                             f"train.py overrides look like --key=value")
    if sweep not in SWEEPS:
        raise SweepError(f"sweep must be one of {sorted(SWEEPS)}, got {sweep!r}")
    opts["seeds"] = parse_seeds(opts["seeds"]) if "seeds" in opts else None
    opts.setdefault("nproc", None)
    if opts["nproc"] is not None:
        try:
            opts["nproc"] = int(opts["nproc"])
        except (TypeError, ValueError):
            raise SweepError(f"--nproc takes an integer >= 1, got {opts['nproc']!r}") from None
        if opts["nproc"] < 1:
            raise SweepError(f"--nproc must be >= 1, got {opts['nproc']}")
    if "out" in opts and (opts["out"] is True or not opts["out"]):
        raise SweepError("--out takes a directory: --out=DIR")
    if "seed" in {o[2:].split("=", 1)[0] for o in overrides}:
        raise SweepError("use --seeds=S1,S2 (the runner's option) rather than --seed")
    return sweep, opts, overrides


def parse_seeds(text):
    """--seeds=S1,S2: distinct integers >= 0."""
    try:
        seeds = [int(x) for x in str(text).split(",")] if text is not True else []
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise SweepError(f"--seeds takes distinct integers >= 0 separated by commas (--seeds=1337,1338), "
                         f"got {'nothing' if text is True else repr(text)}")
    return seeds


def main(argv):
    sweep, opts, overrides = parse_args(argv)
    runs = SWEEPS[sweep]
    sweep_dir = opts.get("out") or sweep_dir_for(sweep, overrides)
    default_seed = 1337
    seeds = opts["seeds"] or [default_seed]
    title, note = f"{sweep} sweep", ("overrides: " + " ".join(overrides)) if overrides else ""
    if opts.get("counts"):
        jobs = plan(runs, sweep_dir=sweep_dir, seeds=seeds[:1], overrides=overrides, check_data=False)
        print(comm_counts(jobs))
        return
    if opts.get("report-only"):
        found = sorted(finished_seeds(sweep_dir, runs))
        jobs = plan(runs, sweep_dir=sweep_dir, seeds=opts["seeds"] or found or seeds, overrides=overrides,
                    nproc=opts["nproc"], check_data=False)
    else:
        jobs = plan(runs, sweep_dir=sweep_dir, seeds=seeds, overrides=overrides, nproc=opts["nproc"],
                    check_data=not opts.get("dry-run"))
        print(f"sweep {sweep!r}: {len(runs)} configs x {len(seeds)} seed(s) = {len(jobs)} runs, "
              f"{tokens_of(jobs[0].cfg):,} tokens each, in {sweep_dir}")
        if opts.get("dry-run"):
            for j in jobs:
                print(("skip  " if is_finished(j) else "run   ") + shown(command(j)))
            return
        from tpcomm.runtime import RunLock

        # held for the whole sweep, report included: a second sweep in this directory refuses to start (a
        # ConfigError, one line) instead of deleting and rewriting the runs of this one
        with RunLock(sweep_dir, what="experiment.py sweep"):
            t0 = time.time()
            try:
                run_sweep(jobs, desc=f"sweep {sweep}")
            except RuntimeError as e:
                print(f"error: {e}", file=sys.stderr)
                sys.exit(1)
            print(f"sweep wall time: {time.time() - t0:.0f} s")
            extra = sorted(finished_seeds(sweep_dir, runs) - set(seeds))  # seeds of earlier invocations
            if extra:
                jobs += plan(runs, sweep_dir=sweep_dir, seeds=extra, overrides=overrides, nproc=opts["nproc"],
                             check_data=False)
            table, plots = report(jobs, sweep_dir, title=title, note=note)
        show_report(sweep_dir, table, plots)
        return
    table, plots = report(jobs, sweep_dir, title=title, note=note)
    show_report(sweep_dir, table, plots)


def show_report(sweep_dir, table, plots):
    print()
    print(table)
    print()
    print(f"tables: {os.path.join(sweep_dir, 'results.md')} (.csv, .json)")
    print("plots:  " + "\n        ".join(plots))


def cli(argv):
    """main with user errors as one line and exit status 2, and Ctrl-C as a note on how to continue."""
    try:
        main(argv)
    except (SweepError, ConfigError, results.ResultsError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("\ninterrupted: finished runs are kept; run the same command again to continue", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    cli(sys.argv[1:])
