r"""
Time training steps (forward, backward, AdamW) on synthetic data: ms/iter, tokens/s, MFU and the measured
tensor-parallel communication. With model_type='distributed_gpt' it also times GPT of the same sizes in the
same run, interleaved, and prints the ratio; --patterns times several block patterns interleaved in one run.
$ python bench.py --n_layer=12 --n_head=8 --n_embd=128 --block_size=64 --batch_size=12 \
      --model_type=distributed_gpt --tp_size=4 --block_types="['tp']*12"
$ python bench.py --device=cuda --compile=True            # GPT-2 124M on a GPU, bf16
$ torchrun --standalone --nproc_per_node=2 bench.py --model_type=distributed_gpt --tp_size=2 --tp_mode=real
$ OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 \
      bench.py --model_type=distributed_gpt --tp_size=2 \
      --tp_mode=real --device=cpu --n_layer=12 --n_head=8 --n_embd=128 --block_size=64 --vocab_size=65 \
      --patterns="['tp', 'spd', ['parallel','spd']*6, 'parallel']"
Every model key train.py takes is a flag here too (--tp_overlap=2, --sequence_parallel=True,
--tp_comm_dtype=int8, ...; tpcomm/bench/bench_config.py), checked as train.py checks it; --variants times
several settings of the sync keys in one run, each over the flags. --mode=decode times generation instead (KV
cache, greedy): prefill ms and per-token decode ms for each pattern and each of --batch_sizes, with the time
in collectives, and --plot=FILE draws ms/token against the all-reduces (in training mode under real TP,
--plot=FILE draws each step's compute, hidden and exposed communication). --mode=memory measures each rank's
peak memory when the model is built and during training steps, for any data-parallel layout
(--data_parallel=ddp|fsdp, --init_device=meta, --loss_parallel):
$ OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=4 bench.py --mode=memory --data_parallel=fsdp \
      --init_device=meta --device=cpu --block_size=128 --batch_size=1 --iters=2
--trace=FILE (mode=train) then profiles --trace_steps more training steps of each model (after its timed ones)
and writes a Chrome trace (tpcomm/bench/trace.py: open it in ui.perfetto.dev; `python -m tpcomm.bench.trace
plot` draws it), every tensor-parallel collective a labelled span, and prints how many collectives each step
holds. One model writes FILE; several (--patterns) write one file each, FILE with `-<N>comm` before its
extension, N the pattern's forward all-reduces (trace-24comm.json, trace-6comm.json; -<N>comm-2 for a second
pattern of the same count; the comparison GPT of a simulated run is not traced). Under real TP rank 0 writes
those names and rank r > 0 adds `.rank<r>` (trace-24comm.rank1.json):
$ OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 \
      bench.py --model_type=distributed_gpt --tp_size=2 \
      --tp_mode=real --device=cpu --n_layer=12 --n_head=8 --n_embd=128 --block_size=64 --vocab_size=65 \
      --patterns="['tp', ['parallel','spd']*6]" --iters=3 --warmup=2 --trace=/tmp/trace.json
--profile=N (mode=train) then profiles N more steps of each model in 3 interleaved rounds and prints the self
CPU time per kind of op (tpcomm/bench/op_profile.py) of each, and each one's difference from GPT's
(docs/benchmarks.md). --mode=pipeline times training steps through pipeline stages
(tpcomm/bench/pipeline_demo.py) under torchrun with pp_size x tp processes, for each of --pp_schedules at each
of --microbatches (micro-batches of batch_size rows): ms/iter, tokens/s, the bubble of the recorded timeline
next to (p-1)/(v m+p-1), each pp rank's peak activation memory (bytes autograd saves for backward, live at
once) and the stage-boundary bytes per token:
$ OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 \
      bench.py --mode=pipeline --pp_size=2 --device=cpu \
      --n_layer=12 --n_head=8 --n_embd=128 --block_size=64 --batch_size=4 --vocab_size=65 \
      --microbatches=[4,8,16]
"""

import sys

import torch

from tpcomm.errors import ConfigError
from tpcomm.configuration import configure, exit_on_config_error
from tpcomm.bench.bench_config import (defaults, combinations, pattern_label, sync_options, validate,
                                       validate_pipeline, variant_name)
from tpcomm.figures import command_figures
from tpcomm.train.build import build_model
from tpcomm.model.interface import timed_step
from tpcomm.train.runtime import DeviceClock, autocast_context, pick_device_and_dtype, setup_runtime
from tpcomm.parallel.parallel_dims import check_layout, init_parallel, launched_by_torchrun, shutdown

def training_setup(model, cfg, device, device_type, dtype):
    """What a training step needs: (the model to call, a fresh AdamW, the autocast
    context, inputs X, targets Y)."""
    optimizer = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), device_type)
    ctx = autocast_context(device_type, dtype)
    g = torch.Generator().manual_seed(cfg["seed"])
    X = torch.randint(cfg["vocab_size"], (cfg["batch_size"], cfg["block_size"]), generator=g).to(device)
    Y = torch.randint(cfg["vocab_size"], (cfg["batch_size"], cfg["block_size"]), generator=g).to(device)
    run = torch.compile(model) if cfg["compile"] else model
    return run, optimizer, ctx, X, Y


def timed_steps(model, cfg, device, device_type, dtype, n, *, clock=None):
    """Run n training steps; return seconds per step and, per step, the exposed and the busy seconds of the
    model's collectives (comm_report's comm_seconds, comm_busy_seconds: 0 for GPT and simulated TP). The clock
    (runtime.DeviceClock of `device` unless given) waits for the device before each reading: the warm-up's
    queued work is done before the timing starts, the timed steps' work before it ends."""
    clock = clock or DeviceClock(device)
    run, optimizer, ctx, X, Y = training_setup(model, cfg, device, device_type, dtype)
    for _ in range(cfg["warmup"]):
        timed_step(run, model, optimizer, ctx, X, Y)
    start = clock.now()
    model.reset_comm_counts()
    for _ in range(n):
        timed_step(run, model, optimizer, ctx, X, Y)
    elapsed = clock.now() - start
    # real TP: exposed (the compute thread inside collectives or waiting for them) and busy (the collectives'
    # own durations, overlapped compute included) seconds since reset_comm_counts, all n steps together
    report = model.comm_report(micro_steps=n, tokens=X.numel())
    return elapsed / n, report.get("comm_seconds", 0.0) / n, report.get("comm_busy_seconds", 0.0) / n


def training_step(model, cfg, device, device_type, dtype):
    """One more training step of model, as a function of nothing; one untimed step first (AdamW creates its
    state in its first step)."""
    run, optimizer, ctx, X, Y = training_setup(model, cfg, device, device_type, dtype)
    timed_step(run, model, optimizer, ctx, X, Y)
    # the step's device work ends inside the call
    return lambda: timed_step(run, model, optimizer, ctx, X, Y).item()


def traced_steps(model, cfg, device, device_type, dtype, path):
    """cfg['trace_steps'] training steps under torch.profiler, written to `path` as a Chrome trace
    (comm_trace.trace_steps); returns the counts of collectives of each step, as read back from the file."""
    from tpcomm.bench.trace import per_step_counts, trace_steps

    one_step = training_step(model, cfg, device, device_type, dtype)
    with trace_steps(path) as tracer:
        for _ in range(cfg["trace_steps"]):
            with tracer.step():
                one_step()
    return per_step_counts(path)


def trace_paths(path, fwd_allreduces, rank=0):
    """{model name: its trace file}. fwd_allreduces: {name: forward all-reduces, None for GPT}, the traced
    models in order. One model: `path`; several: `-<N>comm` (or `-gpt`) before the extension, `-<N>comm-2`,
    ... for later patterns of the same count. Rank r > 0 adds `.rank<r>` before the extension."""
    from tpcomm.bench.trace import rank_path, split_extension

    if len(fwd_allreduces) == 1:
        return {name: rank_path(path, rank) for name in fwd_allreduces}
    root, ext = split_extension(path)
    rank_tag = f".rank{rank}" if rank else ""
    paths, seen = {}, {}
    for name, n in fwd_allreduces.items():
        tag = "-gpt" if n is None else f"-{n}comm"
        seen[tag] = seen.get(tag, 0) + 1
        paths[name] = f"{root}{tag}{'' if seen[tag] == 1 else f'-{seen[tag]}'}{rank_tag}{ext}"
    return paths


def describe_counts(per_step):
    """'24 fwd + 24 bwd all-reduces, 1 grad sync = 49 collective events per step'
    (steps that differ listed)."""
    def one(c):
        extra = "".join(f", {c[k]} {k.replace('_', ' ')}" for k in ("grad_sync", "grad_norm", "vocab",
                                                                    "reduce_scatter", "all_gather")
                        if c.get(k))
        return f"{c['fwd']} fwd + {c['bwd']} bwd all-reduces{extra} = {c['all']} collective events"
    if all(c == per_step[0] for c in per_step):
        return f"{one(per_step[0])} per step"
    return "; ".join(f"step {i}: {one(c)}" for i, c in enumerate(per_step))


@exit_on_config_error
def main(argv):
    cfg = configure(defaults(), argv)
    validate(cfg)  # every option, the models included (tpcomm/bench/bench_config.py)
    pp = cfg["pp_size"] if cfg["mode"] == "pipeline" else 1
    if pp < 1:
        raise ConfigError(f"pp_size must be >= 1, got {pp}")
    if cfg["mode"] == "pipeline" and not launched_by_torchrun():
        raise ConfigError(f"mode='pipeline' runs under torchrun with pp_size x tp processes, e.g. torchrun "
                          f"--standalone "
                          f"--nproc_per_node={pp * (cfg['tp_size'] if cfg['tp_mode'] == 'real' else 1)} "
                          f"bench.py --mode=pipeline ...")
    dp, tp = check_layout(tp_size=cfg["tp_size"], tp_mode=cfg["tp_mode"], pp_size=pp)
    if cfg["mode"] == "pipeline":
        validate_pipeline(cfg, tp)
    if dp != 1 and cfg["mode"] != "memory":
        raise ConfigError(f"bench.py times one model replica: launch tp_size ({cfg['tp_size']}) processes, "
                          "not " f"{dp * tp} (only --mode=memory runs data-parallel replicas)")
    # ConfigError: no such device
    device, device_type, dtype = pick_device_and_dtype(cfg["device"], cfg["dtype"])
    pd = init_parallel(dp=dp, tp=tp, pp=pp, device_type=device_type, backend=cfg["backend"])
    finished = False
    try:
        if pd.distributed and device_type == "cuda":
            device = f"cuda:{pd.local_rank}"
        run = {"memory": memory_bench, "pipeline": pipeline_bench}.get(cfg["mode"], bench)
        run(cfg, pd, device, device_type, dtype)
        finished = True
    finally:
        shutdown(pd, finished=finished)


def pipeline_bench(cfg, pd, device, device_type, dtype):
    """--mode=pipeline: pipeline_demo.bench on the model of the command line (its block_types)."""
    from tpcomm.bench import pipeline_demo
    args = dict(cfg, dropout=0.0)

    def new_model():
        setup_runtime(device_type, cfg["seed"])
        return build_model(cfg["model_type"], args, pd=pd).to(device)

    say = print if pd.is_master else (lambda *a, **k: None)
    say(f"device {device}, dtype {dtype}, {cfg['n_layer']}x{cfg['n_embd']} ({cfg['n_head']} heads), "
        f"{cfg['model_type']} {cfg['block_types'] or ''}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads")
    return pipeline_demo.bench(cfg, pd, new_model=new_model, device=device,
                               ctx=autocast_context(device_type, dtype), say=say)


def peak_memory_mb(device):
    """This process's peak memory so far: CUDA's max allocated on a GPU, else the peak resident set
    (ru_maxrss, which includes the Python interpreter and torch itself)."""
    if str(device).startswith("cuda"):
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # KiB on Linux


def memory_bench(cfg, pd, device, device_type, dtype):
    """Peak memory per rank: before the model, after building it (and sharding, and the optimizer), and after
    cfg['iters'] training steps; plus the parameter bytes each rank holds. One table row per rank."""
    from tpcomm.parallel.data_parallel import parallelize
    from tpcomm.model.interface import local

    # not setup_runtime: keeping freed memory in the process would inflate the peaks
    torch.manual_seed(cfg["seed"])
    args = dict(cfg, dropout=0.0, block_types=cfg["block_types"])
    before = peak_memory_mb(device)
    meta = cfg["init_device"] == "meta"
    model = build_model(cfg["model_type"], args, pd=pd, init_device=cfg["init_device"])
    if not meta:
        model.to(device)
    # DDP needs the weights before wrapping (it broadcasts rank 0's), FSDP shards before materialising
    run, _ = parallelize(model, pd, kind=cfg["data_parallel"], device=device, device_type=device_type,
                         meta=meta, dtype=dtype)
    optimizer = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), device_type)
    held = sum(local(p).numel() * local(p).element_size() for p in model.parameters()) / 2**20
    at_init = peak_memory_mb(device)
    ctx = autocast_context(device_type, dtype)
    g = torch.Generator().manual_seed(cfg["seed"] + pd.dp_rank)
    for _ in range(cfg["iters"]):
        X = torch.randint(cfg["vocab_size"], (cfg["batch_size"], cfg["block_size"]), generator=g).to(device)
        timed_step(run, model, optimizer, ctx, X, X)
    state = sum(local(t).numel() * local(t).element_size() for s in optimizer.state.values()
                for t in s.values()
                if torch.is_tensor(t) and t.dim() > 0) / 2**20  # AdamW's moments, as held here
    row = dict(rank=pd.rank, dp_rank=pd.dp_rank, tp_rank=pd.tp_rank, params_mb=held, state_mb=state,
               before_mb=before, init_mb=at_init, step_mb=peak_memory_mb(device))
    rows = [row]
    if pd.distributed:
        rows = [None] * pd.world_size
        torch.distributed.all_gather_object(rows, row)
    if pd.is_master:
        print(f"memory: {cfg['model_type']} {cfg['n_layer']}x{cfg['n_embd']} "
              f"({model.get_num_params() / 1e6:.1f}M params), dp={pd.dp} {cfg['data_parallel']}, "
              f"tp={cfg['tp_size']} {cfg['tp_mode']}, init_device={cfg['init_device']}, "
              f"loss_parallel={cfg['loss_parallel']}, {cfg['iters']} steps of "
              f"{cfg['batch_size']}x{cfg['block_size']} tokens, {device}")
        print("| rank | parameters held MiB | AdamW state held MiB | peak before model MiB | peak after init "
              "MiB | peak in steps MiB |")
        print("|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['rank']} | {r['params_mb']:.0f} | {r['state_mb']:.0f} | {r['before_mb']:.0f} | "
                  f"{r['init_mb']:.0f} | {r['step_mb']:.0f} |")
    return rows


def decode_times(model, *, batch, prompt_len, new_tokens, vocab_size, device, ctx, clock=None):
    """One greedy generation with the KV cache: (prefill ms, decode ms per token, ms per decoded token in
    collectives and the exposed part of it). Every tp rank runs it alike; the clock (runtime.DeviceClock of
    `device` unless given) waits for the device at each reading, so the prompt's copy is not billed to the
    prefill nor the prefill to the decode."""
    from model import KVCache

    clock = clock or DeviceClock(device)
    prompt = torch.randint(vocab_size, (batch, prompt_len),
                           generator=torch.Generator().manual_seed(0)).to(device)
    cache = KVCache(model.config.n_layer, prompt_len + new_tokens)
    with torch.no_grad(), ctx:
        t0 = clock.now()
        logits, _ = model(prompt, kv_cache=cache)
        token = logits[:, -1].argmax(-1, keepdim=True)
        t1 = clock.now()
        model.reset_comm_counts()
        for _ in range(new_tokens):
            logits, _ = model(token, kv_cache=cache)
            token = logits[:, -1].argmax(-1, keepdim=True)
        t2 = clock.now()
    report = model.comm_report(micro_steps=1, tokens=1)
    per_token = 1e3 / new_tokens
    return ((t1 - t0) * 1e3, (t2 - t1) * per_token, report.get("comm_busy_seconds", 0.0) * per_token,
            report.get("comm_seconds", 0.0) * per_token)


def decode_bench(models, cfg, *, device, dtype, device_type, say):
    """Prefill and per-token decode latency of each model at each batch size, interleaved in rounds (best
    round kept); rows for the table and the plot."""
    sizes = cfg["batch_sizes"] or [cfg["batch_size"]]
    prompt = cfg["prompt_len"] or cfg["block_size"] // 2
    ctx = autocast_context(device_type, dtype)
    for model in models.values():
        model.eval()
    best = {}
    for _ in range(3):
        for name, model in models.items():
            for b in sizes:
                decode_times(model, batch=b, prompt_len=prompt, new_tokens=2, vocab_size=cfg["vocab_size"],
                             device=device, ctx=ctx)  # warm-up
                t = decode_times(model, batch=b, prompt_len=prompt, new_tokens=cfg["new_tokens"],
                                 vocab_size=cfg["vocab_size"], device=device, ctx=ctx)
                best[name, b] = min(best.get((name, b), t), t, key=lambda x: x[1])
    say(f"decode: prompt {prompt} tokens, {cfg['new_tokens']} new tokens, greedy, KV cache")
    say("| block pattern | fwd all-reduces (async) | batch | prefill ms | decode ms/token | in collectives "
        "ms/token | exposed comm ms/token |")
    say("|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name, model in models.items():
        comm = model.comm_per_forward(torch.zeros((1, 2), dtype=torch.long, device=device))
        fwd, asyn = comm.get("fwd_allreduces", 0), comm.get("async_allreduces", 0)
        for b in sizes:
            prefill, per_token, coll, exposed = best[name, b]
            rows.append(dict(pattern=name, fwd_allreduces=fwd, batch=b, prefill_ms=prefill,
                             decode_ms=per_token, collectives_ms=coll, exposed_ms=exposed))
            say(f"| `{name}` | {fwd} ({asyn}) | {b} | {prefill:.2f} | {per_token:.3f} | {coll:.3f} | "
                f"{exposed:.3f} |")
    if cfg["plot"] and say is print:
        data = command_figures.decode_data(rows, cfg=cfg, device=device, prompt_len=prompt,
                                            host=command_figures.host_note())
        command_figures.write(command_figures.draw_decode(data), cfg["plot"], data)
        say(f"plot: {cfg['plot']}")
    return rows


def bench(cfg, pd, device, device_type, dtype):
    setup_runtime(device_type, cfg["seed"])
    args, skipped = dict(cfg, dropout=0.0), []
    tokens = cfg["batch_size"] * cfg["block_size"]
    if cfg["model_type"] == "distributed_gpt":
        runs, skipped = combinations(cfg)
        models = {pattern_label(p) + variant_name(sync_options(cfg, v)):
                  build_model("distributed_gpt", dict(args, block_types=p, **v), pd=pd).to(device)
                  for p, v in runs}
        if cfg["compare"] and cfg["tp_mode"] == "simulated":
            models["gpt"] = build_model("gpt", args).to(device)
    else:
        models = {"gpt": build_model("gpt", args).to(device)}
    say = print if pd.is_master else (lambda *a, **k: None)
    for note in skipped:
        say(note)
    say(f"device {device}, dtype {dtype}, compile {cfg['compile']}, {tokens} tokens/iter, "
        f"{cfg['n_layer']}x{cfg['n_embd']} ({cfg['n_head']} heads), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads")
    if cfg["mode"] == "decode":
        return decode_bench(models, cfg, device=device, dtype=dtype, device_type=device_type, say=say)
    times = {name: [] for name in models}
    rounds = 3  # the models interleaved in rounds, so that machine noise hits all alike
    for _ in range(rounds):
        for name, model in models.items():
            n = max(1, cfg["iters"] // rounds)
            times[name].append((*timed_steps(model, cfg, device, device_type, dtype, n),
                                direction_seconds(model, n)))
    results, fwd_allreduces, rows = {}, {}, []
    width = max(16, *map(len, models))
    for name, model in models.items():
        # best round: the least disturbed by other work on the machine
        dt, comm_dt, busy_dt, split = min(times[name], key=lambda t: t[0])
        mfu = model.estimate_mfu(cfg["batch_size"], dt, device=device, dtype=dtype)
        line = (f"{name:{width}s} {dt * 1000:8.2f} ms/iter  {tokens / dt:10,.0f} tok/s  "
                f"mfu {'n/a' if mfu is None else f'{mfu * 100:.1f}%'}")
        X = torch.randint(cfg["vocab_size"], (cfg["batch_size"], cfg["block_size"]), device=device)
        comm = model.comm_per_forward(X)
        fwd_allreduces[name] = comm.get("fwd_allreduces")
        if comm:  # a model that communicates (GPT's report is empty)
            line += (f"  tp={cfg['tp_size']} {cfg['tp_mode']}  all-reduces fwd {comm['fwd_allreduces']} "
                     f"bwd {comm['bwd_allreduces']}  {comm['comm_bytes_per_token']:.0f} B/token")
            # wall time this rank spent in all-reduces, waiting for the others included
            if cfg["tp_mode"] == "real":
                line += (f"  collectives {busy_dt * 1000:.2f} ms/iter, exposed {comm_dt * 1000:.2f} "
                         f"({100 * comm_dt / dt:.0f}%); fwd / bwd: collectives "
                         f"{split['fwd_busy'] * 1000:.2f} / {split['bwd_busy'] * 1000:.2f}, exposed "
                         f"{split['fwd'] * 1000:.2f} / {split['bwd'] * 1000:.2f}")
        say(line)
        results[name] = dt
        rows.append(dict(comm_row(name, model, cfg, comm, dt=dt, exposed=comm_dt, busy=busy_dt, X=X),
                         split=split))
    if cfg["model_type"] == "distributed_gpt":
        comm_table(rows, cfg, say)
    if cfg["plot"] and cfg["tp_mode"] == "real" and say is print:  # where each step's time goes, measured
        data = command_figures.step_data([r for r in rows if r["name"] != "gpt"], cfg=cfg, device=device,
                                          host=command_figures.host_note())
        command_figures.write(command_figures.draw_steps(data), cfg["plot"], data)
        say(f"plot: {cfg['plot']}")
    for name in results:
        if name != "gpt" and "gpt" in results:
            say(f"ratio {name} / gpt: {results[name] / results['gpt']:.3f}")
    # where each model's step time goes, by kind of op, interleaved in rounds as the timing
    if cfg["profile"]:
        from tpcomm.bench.op_profile import breakdown_table, compare

        steps = {name: training_step(m, cfg, device, device_type, dtype) for name, m in models.items()}
        say(f"\nprofile: {cfg['profile']} steps per model in each of {rounds} rounds, the least total kept")
        say("\n".join(breakdown_table(compare(steps, cfg["profile"], rounds))))
    if cfg["trace"]:  # the models the command names: not the comparison GPT of a distributed_gpt run
        traced = {n: c for n, c in fwd_allreduces.items() if n != "gpt" or cfg["model_type"] == "gpt"}
        paths = trace_paths(cfg["trace"], traced, pd.rank)
        others = [trace_paths(cfg["trace"], traced, r) for r in range(1, pd.world_size)]  # none undistributed
        for name in traced:
            counts = traced_steps(models[name], cfg, device, device_type, dtype, paths[name])
            ranks = (f" (rank 0; rank{'s 1-' if len(others) > 1 else ' '}{len(others)}: "
                     f"{', '.join(o[name] for o in others)})" if others else "")
            say(f"trace {name}: {paths[name]}{ranks}, {cfg['trace_steps']} step(s): "
                f"{describe_counts(counts)}")
    return results


def direction_seconds(model, n):
    """Seconds per step of the n steps timed last, per direction (real TP; 0 otherwise): exposed fwd /
    bwd and in collectives fwd_busy / bwd_busy (comm_report's comm_fwd_seconds, ..., on the device's
    clock: tpcomm/tp/counting.py)."""
    report = model.comm_report(micro_steps=n, tokens=1)
    return {k: report.get(f"comm_{k}_seconds", 0.0) / n for k in ("fwd", "bwd", "fwd_busy", "bwd_busy")}


def comm_row(name, model, cfg, comm, *, dt, exposed, busy, X):
    """One row of the communication table: the counts, the times, and the activations autograd saves
    (measured on this rank) beside the prediction for the blocks (tpcomm.costmodel.activation_memory:
    fp32 values and masks here)."""
    from tpcomm.costmodel.activation_memory import measure_saved_bytes, predicted_activation_bytes

    row = dict(name=name, ms=dt * 1e3, exposed_ms=exposed * 1e3, busy_ms=busy * 1e3,
               fwd=comm.get("fwd_allreduces", 0), asyn=comm.get("async_allreduces", 0),
               rs=comm.get("fwd_reduce_scatters", 0), ag=comm.get("fwd_all_gathers", 0),
               wire=wire_bytes(comm, cfg["tp_size"],
                               two_shot=getattr(model.config, "tp_comm_exchange", None) == "two_shot"))
    if name == "gpt":
        return row
    c = model.config
    model.train()
    row["act_mb"] = measure_saved_bytes(model, X, X) / 2**20
    real = cfg["tp_mode"] == "real"  # simulated: one process holds every shard, as at tp 1
    shape = dict(batch_size=cfg["batch_size"], seq_len=cfg["block_size"], n_embd=c.n_embd, n_head=c.n_head,
                 tp=c.tp_size if real else 1, dropout=False, value_bytes=4, mask_bytes=4)
    # sequence parallelism shards the LN regions of 'tp' blocks
    row["pred_mb"] = sum(predicted_activation_bytes(**shape, sequence_parallel=c.sequence_parallel and real
                                                    and kind == "tp") for kind in c.block_types) / 2**20
    return row


def wire_bytes(comm, p, *, two_shot=False):
    """Bytes per token one rank sends over a ring, forward and backward, from the counted payloads: an
    all-reduce 2(p-1)/p of its tensor, a compressed one p-1 times its payload (one_shot: an all-gather of the
    packed partial sums) or 2(p-1)/p of it (two_shot: all-to-all + all-gather, padding aside), a
    reduce-scatter or an all-gather (sequence parallelism; counted as the whole (N, C) buffer) (p-1)/p of it,
    collective matmul's ring transfers as counted (what a rank sends)."""
    compressed = comm.get("compressed_bytes_per_token", 0.0)
    plain = comm.get("comm_bytes_per_token", 0.0) - compressed
    shrunk = (2 * (p - 1) / p if two_shot else p - 1) * compressed
    return (2 * (p - 1) / p * plain + shrunk + (p - 1) / p * comm.get("sp_bytes_per_token", 0.0)
            + comm.get("ring_bytes_per_token", 0.0))


def comm_table(rows, cfg, say):
    """The table of every pattern and variant of this run: step time, time in collectives and the exposed part
    (real TP; the compute thread blocked in them), the collectives per forward and the saved activations."""
    real = cfg["tp_mode"] == "real"
    say("\n| pattern +variant | fwd all-reduces (async) | fwd RS / AG | ring B/token sent per rank | ms/iter "
        "| in collectives ms/iter | exposed comm ms/iter | saved activations MB (blocks predicted) | "
        "in collectives fwd / bwd | exposed fwd / bwd |")
    say("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if r["name"] == "gpt":
            continue
        times = f"{r['busy_ms']:.2f} | {r['exposed_ms']:.2f}" if real else "n/a (simulated) | n/a"
        ms = {k: 1e3 * v for k, v in r["split"].items()}
        split = (f"{ms['fwd_busy']:.2f} / {ms['bwd_busy']:.2f} | {ms['fwd']:.2f} / "
                 f"{ms['bwd']:.2f}" if real else "n/a | n/a")
        say(f"| `{r['name']}` | {r['fwd']} ({r['asyn']}) | {r['rs']} / {r['ag']} | {r['wire']:,.0f} | "
            f"{r['ms']:.2f} | {times} | {r['act_mb']:.2f} ({r['pred_mb']:.2f}) | {split} |")


if __name__ == "__main__":
    main(sys.argv[1:])
