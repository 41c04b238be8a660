"""
The sweeps: train one config per point (a communication budget, a tp degree, a model size); each
finished run leaves a small result file that is committed to git, and every table and plot is
computed from those files alone (tpcomm/experiments/results.py; the docs':
tpcomm/experiments/report/report.py); `python experiment.py --help`.

A run works in experiments/<sweep>[+overrides]/<run>-seed<S>/ (ignored by git: config.json,
metrics.jsonl, train.log, and done.json once train.py finished); the runner then writes its committed
result file experiments/<sweep>[+overrides]/runs/<run>-seed<S>.json (results.run_record). A run whose
result file records the same config is skipped, so a sweep resumes on any machine from the committed
files alone; a run shared by two sweeps (Run.home) lives in its home sweep's directory; a run with a
valid done.json is recorded, not rerun; an interrupted one starts again, or goes on from its ckpt.pt when
its config checkpoints at every eval. Ctrl-C or kill stops the sweep and its train.py processes. Each run
is locked while it trains (job_lock), so `--jobs=N` (N runs at a time in one process) and N sweep
processes over the same runs alike train N runs at a time; on a GPU machine each run's train.py gets GPUs
no other run holds (CUDA_VISIBLE_DEVICES, GPUClaim). Runner options and every run's train.py config are
checked before the first run starts; a user error is one line, exit status 2.
"""

import contextlib
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

from tpcomm.errors import ConfigError
from tpcomm.configuration import configure
from tpcomm import ROOT, git_state
from tpcomm.experiments import pairing, plots, results
from tpcomm.experiments.gpu_claim import GPUClaim, node_gpus
from tpcomm.experiments.result_check import ResultsError
from tpcomm.experiments.sweep_plan import SWEEP_REMARKS, SWEEP_SEEDS, SWEEPS, Run, runs_named
from tpcomm.experiments.sweep_args import OWN_RUNNERS, parse_args
from tpcomm.experiments.sweep_records import (SCRATCH_DIR, DirtyTreeError, SweepError, finished_seeds,
                                              read_done, record_job, refuse_dirty, rows_of, run_dir_finished,
                                              same_config, scratch_mark)


@dataclass
class Job:
    run: Run
    seed: int
    out_dir: str  # the run's working directory (ignored by git)
    args: list  # train.py arguments
    cfg: dict  # train.py's resolved config for these arguments
    nproc: int
    sweep: str = ""  # the sweep whose directory holds the run (its home)
    result_path: str = ""  # <that directory>/runs/<run>-seed<S>.json (committed)
    # --allow-dirty: a scratch result file (under experiments/scratch/, refused by the report)
    scratch: bool = False

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


def plan(runs, *, sweep_dir, seeds, overrides=(), nproc=None, check_data=True, sweep=None, homes=None):
    """Resolve every run's train.py config and check the sweep before any work: configs load, data exists,
    processes fit the layout, and the runs of one model size train on the same number of tokens. A run with a
    home lives in homes[run.home] (default: sweep_dir too); seed-major order."""
    from tpcomm.train.train_config import defaults

    jobs, scopes = [], {}  # each config file run once
    for seed in seeds:  # seed-major: an unfinished sweep holds whole seeds of every config
        for run in runs:
            if run.seeds is not None and seed not in run.seeds:
                continue
            run_dir = (homes or {}).get(run.home, sweep_dir)
            out_dir = os.path.join(run_dir, f"{run.name}-seed{seed}")
            args = [os.path.join(ROOT, run.config), *run.overrides, f"--seed={seed}", f"--out_dir={out_dir}",
                    f"--wandb_run_name={os.path.basename(run_dir)}-{run.name}-seed{seed}", *overrides]
            try:
                cfg = configure(defaults(), args, scopes=scopes)
                check_train_config(cfg)
            except ConfigError as e:
                raise SweepError(f"{run.name}: {e}") from None
            n = nproc or run.nproc or node_gpus()
            if cfg["tp_mode"] == "real" and n == 1 and cfg["tp_size"] > 1:
                # asked for: one process cannot hold the shards, and is not silently two
                if nproc is not None:
                    raise SweepError(f"{run.name}: --nproc=1 cannot run tp_mode='real' with tp_size "
                                     f"{cfg['tp_size']}: give --nproc a multiple of {cfg['tp_size']}")
                n = cfg["tp_size"]
            tp = cfg["tp_size"] if cfg["tp_mode"] == "real" else 1
            if n % tp or cfg["gradient_accumulation_steps"] % (n // tp):
                raise SweepError(f"{run.name}: nproc ({n}) must be dp x tp with tp = {tp} and "
                                 f"gradient_accumulation_steps ({cfg['gradient_accumulation_steps']}) "
                                 "divisible by dp")
            home = run.home if run.home in (homes or {}) else sweep or os.path.basename(sweep_dir)
            jobs.append(Job(run, seed, out_dir, args, _normal(cfg), n, sweep=home,
                            result_path=os.path.join(run_dir, "runs", f"{run.name}-seed{seed}.json")))
    check_token_budget(jobs)
    if check_data:
        check_data_files(jobs)
    return jobs


def check_data_files(jobs):
    """The jobs' train.bin and val.bin exist (SweepError naming the file and the prepare script otherwise)."""
    data_dirs = {j.cfg["data_dir"] or os.path.join(ROOT, "data", j.cfg["dataset"]) for j in jobs}
    for data_dir in sorted(data_dirs):
        for split in ("train", "val"):
            if not os.path.isfile(os.path.join(data_dir, f"{split}.bin")):
                raise SweepError(f"data file {os.path.join(data_dir, split + '.bin')} not found (run python "
                                 f"data/{os.path.basename(data_dir)}/prepare.py, or pass --data_dir=...)")


def check_train_config(cfg):
    """train.py's checks that need no data, no checkpoint and no torchrun (train_config.check_offline), and
    the runner's own: every run starts from scratch. Raises ConfigError naming key and value."""
    if cfg["init_from"] == "resume":
        raise ConfigError("init_from='resume': the runner starts every run from scratch (a finished run is "
                          "skipped)")
    from tpcomm.train.train_config import check_offline  # torch: imported only when a sweep is planned

    check_offline(cfg)


def tokens_of(cfg):
    return cfg["batch_size"] * cfg["block_size"] * cfg["gradient_accumulation_steps"] * cfg["max_iters"]


def model_size(cfg):
    return cfg["n_layer"], cfg["n_embd"], cfg["n_head"]


def check_token_budget(jobs):
    """The runs of one model size train on the same tokens (a sweep of sizes sets each size's budget)."""
    by_size = {}
    for j in jobs:
        by_size.setdefault(model_size(j.cfg), {})[j.run.name] = tokens_of(j.cfg)
    for budgets in by_size.values():
        if len(set(budgets.values())) > 1:
            detail = ", ".join(f"{name}={t:,}" for name, t in budgets.items())
            raise SweepError(f"runs of one sweep and model size must train on the same tokens (batch_size*"
                             f"block_size*gradient_accumulation_steps*max_iters), got {detail}")
    for j in jobs:
        if j.cfg["max_iters"] % j.cfg["eval_interval"]:
            print(f"warning: {j.run.name}: max_iters ({j.cfg['max_iters']}) is not a multiple of "
                  "eval_interval " f"({j.cfg['eval_interval']}); the 'final' val loss is the one at the last "
                  "eval before it")
            break


def result_problem(job):
    """None when the job's result file is valid and records its config; else why not, in words."""
    if not os.path.exists(job.result_path):
        return "no result file"
    try:
        record = results.read_record(job.result_path, sweep=job.sweep)
    except ResultsError as e:
        return f"not a valid result file ({e})"
    key = same_config(record["config"], job.cfg)
    if key is not None:
        return f"stale: its config has {key}={record['config'][key]!r}, the sweep {key}={job.cfg[key]!r}"
    return None


def is_finished(job):
    """The run has a valid result file of its config: the sweep skips it."""
    return result_problem(job) is None


def command(job):
    """train.py by absolute path, run from the current directory (out_dir and
    --data_dir are relative to it)."""
    train_py = os.path.join(ROOT, "train.py")
    if job.nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc_per_node={job.nproc}", train_py, *job.args]
    return [sys.executable, train_py, *job.args]


def shown(cmd):
    """A command as a user would type it in the repo root."""
    return " ".join(["python"] + [os.path.relpath(a, ROOT) if a.startswith(ROOT + os.sep) else a
                                  for a in cmd[1:]])


STEP_LINE = re.compile(r"^(?:iter|step) (\d+)(?:/\d+)?:")


def resumable(job):
    """An interrupted run of a sweep that checkpoints at every eval (always_save_checkpoint) goes on from its
    ckpt.pt; any other leftover directory is removed and the run starts from scratch."""
    return job.cfg.get("always_save_checkpoint", False) and os.path.isfile(os.path.join(job.out_dir,
                                                                                        "ckpt.pt"))


# the train.py processes of this sweep's runs (several with --jobs): stopped when the sweep is
RUNNING = set()


def run_job(job, *, bar=None):
    """Run train.py (from scratch, or from the run's own checkpoint when resumable), tee its
    output to train.log, and mark success with done.json. Raises RuntimeError with the log's
    tail when train.py fails."""
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
    # GPUs of its own for a run that picks its device (not --device=cpu, nor a cuda:N of the user's choosing)
    on_gpus = job.cfg.get("device", "auto") in ("auto", "cuda")
    with open(log_path, "a" if resume else "w", buffering=1) as log, \
            (GPUClaim(job.nproc) if on_gpus else contextlib.nullcontext()) as gpus:
        # line-buffered: complete up to a kill; gpus: this run's own devices, held until it ends
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        log.write(shown(cmd)
                  + ("" if gpus is None else f"  # CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}")
                  + "\n")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1)
        RUNNING.add(proc)
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
        finally:
            RUNNING.discard(proc)
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


def record_finished(jobs, *, say=print):
    """Result files for the jobs whose run directory holds a finished run of their config but that have no
    valid result file (finished before result files existed, or the file was removed): recorded, not rerun."""
    for job in jobs:
        if not is_finished(job) and run_dir_finished(job):
            say(f"record {job.label}: finished earlier in {job.out_dir}")
            git = git_state()
            refuse_dirty(job, git)
            record_job(job, git=git and dict(git, when="recorded after the run", **scratch_mark(job)))


class RunProgress:
    """What run_job advances (n, total, refresh()): the run's iteration, shown after the one sweep bar."""

    def __init__(self, bar, label, total):
        self.bar, self.label, self.total, self.n = bar, label, total, 0

    def refresh(self):
        self.bar.set_postfix_str(f"{self.label} iter {self.n}/{self.total}", refresh=True)


def finish_job(job, *, progress, say):
    """Record the job's run if its directory holds it finished, else run it (run_job: from scratch, or from
    its checkpoint), then record it; returns the record."""
    if run_dir_finished(job):
        record_finished([job], say=say)
        return results.read_record(job.result_path, sweep=job.sweep)
    done_path = os.path.join(job.out_dir, "done.json")
    if os.path.exists(done_path):
        if read_done(job.out_dir) is None:
            say(f"redo {job.label}: {done_path} is not a valid done.json")
        else:  # a finished run of another config: never resumed from its checkpoint
            say(f"redo {job.label}: {job.out_dir} holds a run of another config; removed")
            shutil.rmtree(job.out_dir)
    git = git_state()  # the code the run starts from
    refuse_dirty(job, git)
    run_job(job, bar=progress)
    return record_job(job, git=git and dict(git, when="run start", **scratch_mark(job)))



def job_lock(job):
    """The lock a sweep holds on a run while it trains it (a file beside the run's directory, which a redo
    removes): two sweep processes over the same runs share them out instead of training one run twice."""
    from tpcomm.train.runtime import RunLock  # torch: imported only when a sweep trains or reports

    return RunLock(os.path.dirname(job.out_dir), what="experiment.py sweep",
                   name=f".{os.path.basename(job.out_dir)}.lock")


def report_lock(sweep_dir):
    """Held while a sweep writes its report: one writer at a time (a second waits)."""
    from tpcomm.train.runtime import RunLock

    return RunLock(sweep_dir, what="experiment.py sweep", wait=True)


def run_one(job, head, problem, *, bar, tty, say):
    """Train (or record) one job that has no valid result file, and say how it went."""
    if os.path.exists(job.result_path):
        say(f"{head}redo {job.label}: {job.result_path}: {problem}")
    progress = RunProgress(bar, job.label, job.cfg["max_iters"] + 1) if tty else None
    rec = finish_job(job, progress=progress, say=say)
    timing = rec["timing"]
    say(f"{head}done {job.label}: val loss {rec['val_loss']:.4f} at iter {rec['final_iter']}, fwd "
        "all-reduces " f"{rec['comm']['fwd_allreduces']}, {results.fmt(timing['step_ms'], '.1f')} ms/step "
        "(median; p90/median " f"{results.fmt(timing['p90_over_median'], '.2f')}), "
        f"{results.fmt(timing['wall_s'], '.0f')} s")


def run_sweep(jobs, *, desc="sweep", at_once=1):
    """Run the jobs without a valid result file, `at_once` at a time, writing each one's result
    file; jobs with one are skipped, and so are jobs another sweep process is training (their locks,
    job_lock). Returns the jobs left to another process. One progress bar, on a terminal only: a log
    gets plain lines, no escape codes."""
    from concurrent.futures import ThreadPoolExecutor
    from tqdm import tqdm

    signal.signal(signal.SIGTERM, stop_on_sigterm)
    tty = sys.stderr.isatty()
    busy = []
    with tqdm(total=len(jobs), desc=desc, unit="run", dynamic_ncols=True, disable=not tty) as bar:
        say = tqdm.write if tty else print

        def one(k, job):
            head = f"[{k}/{len(jobs)}] "
            lock = job_lock(job)
            if result_problem(job) is None:
                say(f"{head}skip {job.label}: already finished ({job.result_path})")
            elif not lock.acquire():
                say(f"{head}busy {job.label}: another sweep process is training it; left to it")
                busy.append(job)
            else:
                try:
                    # again under the lock: the other process may have just finished it
                    problem = result_problem(job)
                    if problem is None:
                        say(f"{head}skip {job.label}: already finished ({job.result_path})")
                    else:
                        run_one(job, head, problem, bar=bar if at_once == 1 else None, tty=tty, say=say)
                finally:
                    lock.release()
            bar.update(1)

        # each run is a train.py process: the threads only wait on it
        with ThreadPoolExecutor(at_once) as pool:
            futures = [pool.submit(one, k, job) for k, job in enumerate(jobs, 1)]
            try:
                for f in futures:
                    f.result()
            except BaseException:  # a failed run, Ctrl-C or SIGTERM: stop the others too
                pool.shutdown(cancel_futures=True, wait=False)
                for proc in list(RUNNING):
                    proc.terminate()
                raise
    return busy


def report(jobs, sweep_dir, *, title, note="", remark=""):
    """Tables and plots in sweep_dir from the jobs' result files; returns (markdown table, plot paths)."""
    try:
        rows, missing = rows_of(jobs)
    except ResultsError as e:  # a result file is corrupt: name the file, no traceback
        raise SweepError(f"cannot report {sweep_dir}: {e}") from None
    if missing:
        print(f"no finished runs yet for: {', '.join(missing)}")
    if not rows:
        raise SweepError(f"no finished runs in {sweep_dir}")
    results.write_tables(rows, sweep_dir, title=title, note="\n\n".join(t for t in (note, remark) if t))
    pngs = plots.write_plots(rows, sweep_dir, title=title, note=note)
    paired = plots.write_paired(rows, sweep_dir, title=title)
    if paired:  # 2+ seeds: the paired comparison with the baseline
        pngs.append(paired[1])
        return results.markdown_table(rows) + "\n\n" + pairing.paired_markdown(rows), pngs
    return results.markdown_table(rows), pngs


def comm_counts(jobs, *, tokens=64):
    """Markdown table of each config's collectives, measured by one forward+backward pass on CPU (fp32, and
    bf16 under autocast) of the config's own model: all-reduces per pass and bytes per token per rank."""
    import torch

    from tpcomm.train.build import build_model

    lines = ["| config | block pattern | tp_size | fwd all-reduces | bwd all-reduces | bytes/token fp32 | "
             "bytes/token bf16 |", "|---|---|---:|---:|---:|---:|---:|"]
    for j in jobs:
        torch.manual_seed(0)
        # the vocabulary never enters the communication (embeddings and lm_head are replicated; the
        # vocabulary-parallel loss all-reduces per token), so a small one: GPT-2's would dominate the time
        model = build_model(j.cfg["model_type"], dict(j.cfg, dropout=0.0, vocab_size=256))
        idx = torch.randint(256, (1, min(tokens, j.cfg["block_size"])))
        fp32 = model.comm_per_forward(idx)
        if not fp32:  # the model ran no collective (GPT)
            raise SweepError(f"{j.run.name}: model_type={j.cfg['model_type']!r} has no tensor-parallel "
                             "communication")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = model.comm_per_forward(idx)
        # + a run's change
        config = os.path.basename(j.run.config) + "".join(f" {o}" for o in j.run.overrides)
        lines.append(f"| {config} | `{results.block_pattern(j.cfg)}` | {j.cfg['tp_size']} | "
                     f"{fp32['fwd_allreduces']} | {fp32['bwd_allreduces']} | "
                     f"{fp32['comm_bytes_per_token']:,.0f} | {bf16['comm_bytes_per_token']:,.0f} |")
    return "\n".join(lines)


def homes_of(runs, overrides, *, out=None):
    """{home sweep: its directory} of the shared runs (none with --out: every run in that directory)."""
    return {} if out else {r.home: sweep_dir_for(r.home, overrides) for r in runs if r.home}


def main(argv, *, report_main=None):
    """Run (or dry-run, count, report) one sweep; `report ...` calls report_main (the report's main, which
    reads this module's sweeps: experiment.py passes it in)."""
    sweep, opts, overrides = parse_args(argv)
    if sweep == "report":
        if report_main is None:
            raise SweepError("report: run it as `python experiment.py report`")
        status = report_main(opts["sweeps"], check=opts["check"])
        if status:
            sys.exit(status)
        return
    runs = runs_named(sweep, opts.get("runs"))
    if runs is None:
        raise SweepError(f"--runs takes run names of {sweep!r} ({', '.join(r.name for r in SWEEPS[sweep])}), "
                         "got " f"{opts['runs']!r}")
    sweep_dir = opts.get("out") or sweep_dir_for(sweep, overrides)
    if opts.get("allow-dirty"):  # scratch: every run (shared ones too) in an ignored directory
        sweep_dir = opts["out"] = os.path.join(SCRATCH_DIR, os.path.basename(os.path.normpath(sweep_dir)))
    homes = homes_of(runs, overrides, out=opts.get("out"))
    dirs = sorted({sweep_dir, *homes.values()})
    seeds = opts["seeds"] or list(SWEEP_SEEDS.get(sweep, (1337,)))
    title, note = f"{sweep} sweep", ("overrides: " + " ".join(overrides)) if overrides else ""
    remark = "" if overrides else SWEEP_REMARKS.get(sweep, "")  # about the sweep as defined
    planned = dict(sweep_dir=sweep_dir, overrides=overrides, sweep=sweep, homes=homes)
    if opts.get("counts"):
        jobs = plan(runs, seeds=seeds[:1], check_data=False, **planned)
        print(comm_counts(jobs))
        return
    if opts.get("report-only"):
        found = sorted(finished_seeds(dirs, runs))
        # before the report's lock: nothing is written into an empty directory
        if not found and not opts["seeds"]:
            raise SweepError(f"no finished runs in {', '.join(dirs)}: nothing to report (run the sweep "
                             "first)")
        jobs = plan(runs, seeds=opts["seeds"] or found or seeds, nproc=opts["nproc"], check_data=False,
                    **planned)
        with report_lock(sweep_dir):
            record_finished(jobs)
            table, plots = report(jobs, sweep_dir, title=title, note=note, remark=remark)
        show_report(sweep_dir, table, plots, remark=remark)
        return
    jobs = plan(runs, seeds=seeds, nproc=opts["nproc"], check_data=False, **planned)
    for j in jobs:
        j.scratch = bool(opts.get("allow-dirty"))
    if not opts.get("dry-run"):  # data for the runs to train (with every result file committed: none needed)
        todo = [j for j in jobs if not is_finished(j)]
        for j in todo[:1]:  # the tree is the same for every run: refused before any work
            refuse_dirty(j, git_state())
        check_data_files(todo)
    print(f"sweep {sweep!r}: {len(runs)} configs x {len({j.seed for j in jobs})} seed(s) = {len(jobs)} runs, "
          f"{', '.join(f'{t:,}' for t in sorted({tokens_of(j.cfg) for j in jobs}))} tokens each, in "
          f"{', '.join(dirs)}")
    if opts.get("dry-run"):
        for j in jobs:
            print(("skip  " if is_finished(j) else "run   ") + shown(command(j)))
        if sweep == "gpt2":  # GPU-hours (tpcomm/experiments/gpu_node.py)
            from tpcomm.experiments.gpu_node import gpt2_gpu_hours
            print(gpt2_gpu_hours([j for j in jobs if not is_finished(j)]))
        return
    t0 = time.time()
    try:
        busy = run_sweep(jobs, desc=f"sweep {sweep}", at_once=opts.get("jobs") or 1)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"sweep wall time: {time.time() - t0:.0f} s")
    busy = [j for j in busy if not is_finished(j)]  # the other process may have finished them meanwhile
    if busy:
        print(f"{len(busy)} run(s) still trained by another sweep process: this report lacks them (when it "
              f"finishes, its report has them; or: --report-only)")
    extra = sorted(finished_seeds(dirs, runs) - set(seeds))  # seeds of earlier invocations
    if extra:
        jobs += plan(runs, seeds=extra, nproc=opts["nproc"], check_data=False, **planned)
    with report_lock(sweep_dir):
        table, plots = report(jobs, sweep_dir, title=title, note=note, remark=remark)
    show_report(sweep_dir, table, plots, remark=remark)


def show_report(sweep_dir, table, plots, *, remark=""):
    print(f"\n{table}\n\n" + (f"{remark}\n\n" if remark else ""), end="")
    print(f"tables: {os.path.join(sweep_dir, 'results.md')} (.csv, .json)")
    print("plots:  " + "\n        ".join(plots))
    print("docs:   python experiment.py report   (README/docs tables and plots from the result files)")


def cli(argv, *, report_main=None):
    """main with user errors as one line and exit status 2, and Ctrl-C as a note on how to continue. --help
    (-h): the entry script's docstring and the sweeps."""
    if "--help" in argv or "-h" in argv:
        doc = (sys.modules["__main__"].__doc__ or __doc__ or "").strip()
        print(f"{doc}\n\nsweeps: {', '.join([*SWEEPS, *OWN_RUNNERS])}\nrunner options: --seeds=A,B --nproc=N "
              "--jobs=N --out=DIR --report-only --dry-run --counts --runs=A,B --allow-dirty; other "
              "--key=value options go to train.py")
        sys.exit(0)
    try:
        main(argv, report_main=report_main)
    except (SweepError, ConfigError, ResultsError, DirtyTreeError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("\ninterrupted: finished runs are kept; run the same command again to continue",
              file=sys.stderr)
        sys.exit(130)

