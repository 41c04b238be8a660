"""
The pipeline benchmark of bench.py --mode=pipeline (bench: ms/iter, tokens/s, the recorded bubble next to
(p-1)/(v m+p-1), each pp rank's peak activation memory, the stage-boundary bytes) and the pipeline demo: a few
training steps of a DistributedGPT through tpcomm/parallel/pipeline.py's stages, then the timeline of the last
step, what each pp rank sent and received, the measured bubble and the bytes across each cut.

Demo (pp 4 x tp 2 real on CPU, gloo; OMP_NUM_THREADS=1 on a small machine):
    torchrun --standalone --nproc_per_node=8 \
        -m tpcomm.bench.pipeline_demo --tp_size=2 --pp_size=4 --schedule=1f1b
Benchmark: bench.py --mode=pipeline (see bench.py's docstring), which calls bench() here.
"""

import sys
import time

import torch
import torch.distributed as dist

from tpcomm.errors import ConfigError
from tpcomm.configuration import configure, exit_on_config_error
from tensor_parallel_model import DistributedGPT
from tpcomm.model.options import TPConfig, validate_tp_args
from tpcomm.parallel.parallel_dims import init_parallel, launched_by_torchrun, shutdown, world_size
from tpcomm.costmodel.activation_memory import ActivationMemory
from tpcomm.parallel.pipeline import Pipeline, build_pipeline
from tpcomm.parallel.pipeline_config import validate_pp_layout
from tpcomm.parallel.pipeline_timeline import (bubble_fraction, format_events, format_timeline,
                                               theoretical_bubble)


# ---------------------------------------------------------------- bench.py --mode=pipeline

def bench(cfg, dims, *, new_model, device, ctx, say):
    """Time training steps through each schedule of cfg['pp_schedules'] at each micro-batch count of
    cfg['microbatches'] (micro-batches of cfg['batch_size'] rows): ms/iter and tokens/s of this replica,
    the bubble of the recorded timeline next to (p-1)/(v m+p-1), the peak activation memory each pp rank
    holds (ActivationMemory) and the pp boundary bytes. new_model() builds the model (the same weights
    each time). Returns the rows."""
    B, T = cfg["batch_size"], cfg["block_size"]
    rows = []
    for schedule in cfg["pp_schedules"]:
        v = cfg["pp_virtual_stages"] if schedule == "interleaved_1f1b" else 1
        for m in cfg["microbatches"]:
            model = new_model()
            pipe = Pipeline(model, dims, schedule=schedule, n_microbatches=m, batch_size=m * B, seq_len=T,
                            virtual_stages=v, device=device)
            optimizer = pipe.configure_optimizers(0.1, 1e-4, (0.9, 0.95), torch.device(device).type)
            g = torch.Generator().manual_seed(cfg["seed"])
            data = torch.randint(cfg["vocab_size"], (m, 2, B, T), generator=g).to(device)
            micro_batches = [(data[i, 0], data[i, 1]) for i in range(m)]
            memory = ActivationMemory(pipe.parameters())
            for i in range(cfg["warmup"] + cfg["iters"]):
                if i == cfg["warmup"]:
                    dist.barrier()
                    t0 = time.perf_counter()
                with memory.hooks():
                    pipe.step(micro_batches, ctx=ctx)
                optimizer.step()
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize()
            dt = (time.perf_counter() - t0) / cfg["iters"]
            events = pipe.comm.gather_events()  # of the last step
            actions = {r: [(k, s, mb) for k, s, mb, _ in ev if k in ("F", "B")] for r, ev in events.items()}
            peaks = [None] * dims.pp
            dist.all_gather_object(peaks, memory.peak, group=dims.pp_group)
            report = pipe.comm_report(tokens=B * T)
            rows.append(dict(schedule=schedule, pp=dims.pp, v=v, m=m, ms=dt * 1000,
                             tokens_per_s=m * B * T / dt, bubble=bubble_fraction(actions),
                             theory=theoretical_bubble(dims.pp, m, v), peak_mib=[p / 2**20 for p in peaks],
                             pp_bytes_per_token=report["pp_bytes_per_token"]))
            del pipe, model, optimizer
    say(f"pp={dims.pp} x tp={dims.tp} ({dist.get_world_size()} processes), {B} x {T} tokens per micro-batch, "
        f"layers per stage: balanced")
    say("| schedule | pp | v | micro-batches | ms/iter | tokens/s | bubble (timeline) | theory (p-1)/(v "
        "m+p-1) | peak activations per pp rank (MiB) | pp B/token |")
    say("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        say(f"| {r['schedule']} | {r['pp']} | {r['v']} | {r['m']} | {r['ms']:.1f} | {r['tokens_per_s']:,.0f} "
            "| " f"{r['bubble']:.3f} | {r['theory']:.3f} | {' / '.join(f'{p:.2f}' for p in r['peak_mib'])} | "
            f"{r['pp_bytes_per_token']:,.0f} |")
    return rows


# ---------------------------------------------------------------- demo

DEMO = dict(pp_size=4, tp_size=2, tp_mode="real", schedule="1f1b", virtual_stages=1, n_microbatches=8,
            pp_layers=None, batch_size=16, block_size=16, n_layer=8, n_head=4, n_embd=32, vocab_size=64,
            block_types=["spd", "parallel"] * 4, steps=2, seed=1337, dtype="float32")


@exit_on_config_error
def main(argv):
    cfg = configure(DEMO, argv)
    world = world_size()
    tp = cfg["tp_size"] if cfg["tp_mode"] == "real" else 1
    if cfg["tp_mode"] not in ("real", "simulated"):
        raise ConfigError(f"tp_mode must be 'real' or 'simulated', got {cfg['tp_mode']!r}")
    validate_tp_args(n_layer=cfg["n_layer"], n_head=cfg["n_head"], n_embd=cfg["n_embd"],
                     tp_size=cfg["tp_size"], block_types=cfg["block_types"])
    validate_pp_layout(world=world, pp_size=cfg["pp_size"], tp=tp, n_layer=cfg["n_layer"],
                       schedule=cfg["schedule"], n_microbatches=cfg["n_microbatches"],
                       virtual_stages=cfg["virtual_stages"], pp_layers=cfg["pp_layers"],
                       batch_size=cfg["batch_size"])
    if not launched_by_torchrun():  # the demo's exchanges (timeline, counts, memory) run on a process group
        raise ConfigError("tpcomm.bench.pipeline_demo runs under torchrun, also at pp_size=1: torchrun "
                          "--standalone --nproc_per_node=PP*TP -m tpcomm.bench.pipeline_demo ...")
    dims = init_parallel(dp=world // (cfg["pp_size"] * tp), tp=tp, pp=cfg["pp_size"], device_type="cpu",
                         backend="gloo")
    finished = False
    try:
        demo(cfg, dims)
        finished = True
    finally:
        shutdown(dims, finished=finished)


def demo(cfg, dims):
    torch.manual_seed(cfg["seed"])
    sizes = {k: cfg[k] for k in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd")}
    model = DistributedGPT(TPConfig(**sizes, tp_size=cfg["tp_size"], block_types=cfg["block_types"]),
                           pd=dims if dims.tp > 1 else None).to(getattr(torch, cfg["dtype"]))
    pipe = build_pipeline(model, dims, schedule=cfg["schedule"], n_microbatches=cfg["n_microbatches"],
                          batch_size=cfg["batch_size"], seq_len=cfg["block_size"],
                          virtual_stages=cfg["virtual_stages"], pp_layers=cfg["pp_layers"])
    optimizer = pipe.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    m, mb = cfg["n_microbatches"], cfg["batch_size"] // cfg["n_microbatches"]
    say = print if dims.is_master else (lambda *a, **k: None)
    say(f"pp={dims.pp} x dp={dims.dp} x tp={dims.tp} ({dist.get_world_size()} processes), schedule "
        f"{cfg['schedule']}, {dims.pp * cfg['virtual_stages']} stages of layers {pipe.layers}, {m} "
        "micro-batches of " f"{mb} x {cfg['block_size']} tokens, blocks {cfg['block_types']}")
    for it in range(cfg["steps"]):
        g = torch.Generator().manual_seed(it)
        data = torch.randint(cfg["vocab_size"], (dims.dp, m, 2, mb, cfg["block_size"]),
                             generator=g)[dims.dp_rank]
        pipe.reset_comm_counts()
        loss = pipe.step([(data[i, 0], data[i, 1]) for i in range(m)])
        pipe.clip_grad_norm_(1.0)
        optimizer.step()
        say(f"step {it}: loss {loss:.4f}")
    events = pipe.comm.gather_events()  # of the last step
    report = pipe.comm_report(tokens=mb * cfg["block_size"])
    if not dims.is_master:
        return
    actions = {r: [(k, s, mb_) for k, s, mb_, _ in ev if k in ("F", "B")] for r, ev in events.items()}
    print("\ntimeline of the last step (one slot per forward F or backward B of micro-batch m on one stage, "
          "'.' idle):")
    print(format_timeline(actions, dims.pp))
    print("\nwhat each pp rank did, in order (>a3/<a3: activations of micro-batch 3 sent/received, >g3/<g3: "
          "gradients):")
    for r, ev in events.items():
        print(f"pp{r}: {format_events(ev, dims.pp)}")
    v = cfg["virtual_stages"]
    formula = "(p-1)/(v m+p-1)" if cfg["schedule"] == "interleaved_1f1b" else "(p-1)/(m+p-1)"
    print(f"\nbubble: measured {bubble_fraction(actions):.4f} (idle slots / all slots of the recorded "
          "timeline), " f"theory {formula} = {theoretical_bubble(dims.pp, m, v):.4f} (p={dims.pp}, m={m}, "
          f"v={v})")
    print("\nper micro-batch and rank, across each stage boundary:")
    for cut in report["pp_boundaries"]:
        print(f"  stage {cut['cut']}: {cut['stream']:<8} forward {cut['fwd_bytes']} B, backward "
              f"{cut['bwd_bytes']} B")
    print(f"tp all-reduces per micro-batch (whole model): forward {report['fwd_allreduces']}, backward "
          f"{report['bwd_allreduces']}, {report['comm_bytes_per_token']:.0f} B/token; pp boundaries "
          f"{report['pp_bytes_per_token']:.0f} B/token")


if __name__ == "__main__":
    main(sys.argv[1:])
