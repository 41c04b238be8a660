"""
Time training steps (forward, backward, AdamW) on synthetic data: ms/iter, tokens/s, MFU and the measured
tensor-parallel communication. With model_type='distributed_gpt' it also times GPT of the same sizes in the
same run, interleaved, and prints the ratio; --patterns times several block patterns interleaved in one run.
$ python bench.py --n_layer=12 --n_head=8 --n_embd=128 --block_size=64 --batch_size=12 \
      --model_type=distributed_gpt --tp_size=4 --block_types="['tp']*12"
$ python bench.py --device=cuda --compile=True            # GPT-2 124M on a GPU, bf16
$ torchrun --standalone --nproc_per_node=2 bench.py --model_type=distributed_gpt --tp_size=2 --tp_mode=real
$ OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 bench.py --model_type=distributed_gpt --tp_size=2 \
      --tp_mode=real --device=cpu --n_layer=12 --n_head=8 --n_embd=128 --block_size=64 --vocab_size=65 \
      --patterns="['tp', 'spd', ['parallel','spd']*6, 'parallel']"
"""

import sys
import time

import torch

from common import autocast_context, build_model, pick_device, pick_dtype, setup_runtime
from configurator import ConfigError, configure, exit_on_config_error
from parallel import check_layout, init_parallel, shutdown

DEFAULTS = dict(
    model_type="gpt",
    tp_size=1,
    block_types=None,
    patterns=None,  # distributed_gpt: a list of block_types values to time in one run, instead of block_types
    tp_mode="simulated",
    n_layer=12,
    n_head=12,
    n_embd=768,
    block_size=1024,
    vocab_size=50304,
    bias=False,
    batch_size=12,
    iters=20,  # timed steps per model
    warmup=5,  # untimed steps per model
    compare=True,  # distributed_gpt: also time GPT of the same sizes and print the ratio
    device="auto",
    dtype="auto",
    compile=False,
    backend=None,
    seed=1337,
)


def timed_steps(model, cfg, device, device_type, dtype, n):
    """Run n training steps; return seconds per step and, for DistributedGPT, seconds per step spent inside its
    real collectives (0 when simulated). CUDA work is waited for through .item()."""
    optimizer = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), device_type)
    ctx = autocast_context(device_type, dtype)
    g = torch.Generator().manual_seed(cfg["seed"])
    X = torch.randint(cfg["vocab_size"], (cfg["batch_size"], cfg["block_size"]), generator=g).to(device)
    Y = torch.randint(cfg["vocab_size"], (cfg["batch_size"], cfg["block_size"]), generator=g).to(device)
    run = torch.compile(model) if cfg["compile"] else model
    for _ in range(cfg["warmup"]):
        step(run, model, optimizer, ctx, X, Y)
    counter = getattr(getattr(model, "comm", None), "counter", None)
    comm_start = counter.seconds if counter is not None else 0.0
    start = time.perf_counter()
    for _ in range(n):
        loss = step(run, model, optimizer, ctx, X, Y)
    loss.item()
    comm = (counter.seconds - comm_start) / n if counter is not None else 0.0
    return (time.perf_counter() - start) / n, comm


def step(run, model, optimizer, ctx, X, Y):
    with ctx:
        _, loss = run(X, Y)
    loss.backward()
    if hasattr(model, "sync_replicated_grads"):
        model.sync_replicated_grads()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


@exit_on_config_error
def main(argv):
    cfg = configure(DEFAULTS, argv)
    if cfg["model_type"] == "distributed_gpt":
        from tensor_parallel_model import validate_tp_args

        if cfg["patterns"] is not None and (cfg["block_types"] is not None or not isinstance(cfg["patterns"], list)):
            raise ConfigError(f"patterns must be a list of block_types values, given instead of block_types; got "
                              f"patterns={cfg['patterns']!r}, block_types={cfg['block_types']!r}")
        for block_types in cfg["patterns"] or [cfg["block_types"]]:
            validate_tp_args(n_layer=cfg["n_layer"], n_head=cfg["n_head"], n_embd=cfg["n_embd"],
                             tp_size=cfg["tp_size"], block_types=block_types)
    elif cfg["model_type"] != "gpt":
        raise ConfigError(f"model_type must be 'gpt' or 'distributed_gpt', got {cfg['model_type']!r}")
    dp, tp = check_layout(tp_size=cfg["tp_size"], tp_mode=cfg["tp_mode"])
    if dp != 1:
        raise ConfigError(f"bench.py times one model replica: launch tp_size ({cfg['tp_size']}) processes, not "
                          f"{dp * tp}")
    device = pick_device(cfg["device"])
    device_type = "cuda" if device.startswith("cuda") else device
    dtype = pick_dtype(cfg["dtype"], device_type)
    pd = init_parallel(dp=dp, tp=tp, device_type=device_type, backend=cfg["backend"])
    try:
        if pd.distributed and device_type == "cuda":
            device = f"cuda:{pd.local_rank}"
        bench(cfg, pd, device, device_type, dtype)
    finally:
        shutdown(pd)


def bench(cfg, pd, device, device_type, dtype):
    setup_runtime(device_type, cfg["seed"])
    args = dict(cfg, dropout=0.0)
    tokens = cfg["batch_size"] * cfg["block_size"]
    if cfg["model_type"] == "distributed_gpt":
        models = {pattern_name(p): build_model("distributed_gpt", dict(args, block_types=p), pd=pd).to(device)
                  for p in cfg["patterns"] or [cfg["block_types"]]}
        if cfg["compare"] and cfg["tp_mode"] == "simulated":
            models["gpt"] = build_model("gpt", args).to(device)
    else:
        models = {"gpt": build_model("gpt", args).to(device)}
    say = print if pd.is_master else (lambda *a, **k: None)
    say(f"device {device}, dtype {dtype}, compile {cfg['compile']}, {tokens} tokens/iter, "
        f"{cfg['n_layer']}x{cfg['n_embd']} ({cfg['n_head']} heads), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads")
    # interleave the models in rounds so that machine noise hits all alike
    times = {name: [] for name in models}
    rounds = 3
    for _ in range(rounds):
        for name, model in models.items():
            times[name].append(timed_steps(model, cfg, device, device_type, dtype, max(1, cfg["iters"] // rounds)))
    results = {}
    width = max(16, *map(len, models))
    for name, model in models.items():
        dt, comm_dt = min(times[name])  # best round: the least disturbed by other work on the machine
        mfu = model.estimate_mfu(cfg["batch_size"], dt, device=device)
        line = (f"{name:{width}s} {dt * 1000:8.2f} ms/iter  {tokens / dt:10,.0f} tok/s  "
                f"mfu {'n/a' if mfu is None else f'{mfu * 100:.1f}%'}")
        if name != "gpt":
            X = torch.randint(cfg["vocab_size"], (cfg["batch_size"], cfg["block_size"]), device=device)
            comm = model.comm_per_forward(X)
            line += (f"  tp={cfg['tp_size']} {cfg['tp_mode']}  all-reduces fwd {comm['fwd_allreduces']} "
                     f"bwd {comm['bwd_allreduces']}  {comm['comm_bytes_per_token']:.0f} B/token")
            if cfg["tp_mode"] == "real":  # wall time this rank spent in all-reduces, waiting for the others included
                line += f"  collectives {comm_dt * 1000:.2f} ms/iter ({100 * comm_dt / dt:.0f}%)"
        say(line)
        results[name] = dt
    for name in results:
        if name != "gpt" and "gpt" in results:
            say(f"ratio {name} / gpt: {results[name] / results['gpt']:.3f}")
    return results


def pattern_name(block_types):
    """'distributed_gpt' for a single default model; a short label per pattern: 'spd', ['parallel','spd']*6."""
    from results import compact_list

    if block_types is None or isinstance(block_types, str):
        return "distributed_gpt" if block_types is None else block_types
    return compact_list(block_types)


if __name__ == "__main__":
    main(sys.argv[1:])
