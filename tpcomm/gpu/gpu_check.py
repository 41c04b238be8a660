"""
`make gpu-check`: what one CUDA GPU can measure in a few minutes, written to OUT_DIR/gpu.json and into
the generated section of OUT_DIR/gpu.md (docs/gpu.md says how to read it). A GPU may be at hand only
briefly, so every section is time-boxed and failure-isolated: a section that fails or runs out of time
records its error and the next one runs.

$ python -m tpcomm.gpu.gpu_check                                              # one CUDA GPU: GPT-2 124M
                                                                              # sizes, ~6 min, into docs/
$ python -m tpcomm.gpu.gpu_check --sizes=tiny --device=cpu --out_dir=/tmp/gc  # the CPU rehearsal of every
                                                                              # section (~30 s)
$ python -m tpcomm.gpu.gpu_check --sections=gpt_train,bf16_identity           # some sections only

Sections (SECTIONS, in order):
- gpt_train: GPT, bf16, block 1024, batch 12: ms/iter, tokens/s and MFU against the device's peak, eager and
  torch.compile'd (interleaved rounds, best kept), and the graphs dynamo compiled (one expected, no graph
  break).
- sim_tp8: simulated DistributedGPT at tp 8, all 'tp', 'spd', 'parallel' and 'ladder', each step as a ratio to
  GPT's timed in the same rounds (8 heads: 12 do not split over 8 shards).
- decode: KV-cache greedy decode, batch 1 and 16: ms/token of GPT, all 'tp' and all 'spd' (simulated tp 8).
- real_tp: 2 processes sharing the one GPU (gloo on CUDA tensors: NCCL refuses two ranks on one device),
  launched with torch.distributed.run from here: 10 AdamW steps of real tp 2 against the simulation, losses to
  1e-9 (fp64), then each model option (async backward, tp_overlap, sequence parallelism in fp32 to 1e-4 with
  TF32 off; the int8 exchanges in fp64) for 3 steps; and the comm-time sanity check on the same ranks.
- comm_sanity: a 64 MiB all-reduce through the model's tp group: its in-collective time (the counter the
  sweeps read) must be above what the fastest link could do (64 MiB / 1 TB/s) and below the synchronised wall
  time of the step that holds it. A clock that reads queued work (NCCL returns at enqueue) fails the first
  bound.
- bf16_identity: every block's c_proj zeroed, so each block must leave the stream unchanged: the largest
  deviation of the stream entering ln_f from the embedding, under bf16 autocast, per block type at tp 2, 4 and
  8, and for two sequence-parallel patterns (a synced and a desynced stream entering each syncing block); then
  in training passes (gradients on), the loss minus GPT's for 'tp', 'spd' and 'parallel' at tp 2, 4 and 8 with
  each option the validator allows (tp_async_grad, tp_overlap, sequence_parallel, alone and combined:
  tpcomm/gpu/bf16_identity.py).
- cost_model: the cost model's assumed MFU (tpcomm.costmodel.cost_model) beside the measured one, and its
  compute-term step time beside the measured step.
- cost_calibration: one 1.3B tp-8 shard block forward and backward (bf16, eager and compiled), its GEMMs whole
  and at 1/tp of the tokens, int8 and fp8 quantize + dequantize, each beside the cost model's term
  (tpcomm/gpu/cost_calibration.py); tpcomm/costmodel/cost_bands.py narrows its GEMM-efficiency range from it.
Timings on CUDA synchronise the device before reading the clock.
"""

import datetime
import json
import os
import sys
import tempfile
import time

import torch

from tpcomm.errors import ConfigError
from tpcomm.configuration import configure, exit_on_config_error
from tpcomm import ROOT, git_state
from tpcomm.gpu.gpu_report import (COMPRESSIBLE_TYPES, merge_sections, mergeable, read_report, write_json,
                                   write_markdown)
from tpcomm.gpu.cost_calibration import cost_calibration
from tpcomm.train.runtime import sync
from tpcomm.gpu.gpu_tools import SectionTimeout, allreduce_sanity, launch, time_box, timed_steps
from tpcomm.train.output_path import check_folder, check_output_file, json_with

SECTIONS = ("gpt_train", "sim_tp8", "decode", "real_tp", "comm_sanity", "bf16_identity", "cost_model",
            "cost_calibration")
LOSS_TOL = 1e-4  # fp32 real vs simulated losses (the bound), over OPTION_STEPS steps
# The two patterns' REAL_STEPS steps run in float64: in float32 (TF32 off) two H100 runs drifted to 7.3e-5 and
# 2.5e-4 by the tenth step on losses near 10 (cuBLAS sums a sharded product in another order than the whole
# one; CPU: 5e-7)
REAL_DTYPE, REAL_TOL = "float64", 1e-9
REAL_STEPS = 10
# The model options through real TP too, OPTION_STEPS steps each (the first H100 run found a CUDA-only defect
# in the asynchronous g). The int8 exchanges run in float64: in float32 a partial sum that differs in its last
# bit between the real and the simulated product can move a quantized value a whole int8 step (6e-4 in the
# loss in 3 steps).
OPTION_STEPS = 3
OPTION_CASES = [("async backward", dict(tp_async_grad=True), "float32"),
                ("tp_overlap=2, async backward", dict(tp_overlap=2, tp_async_grad=True), "float32"),
                ("sequence parallel", dict(sequence_parallel=True, block_types=["tp", "spd", "parallel"]),
                 "float32"), ("int8 one-shot", dict(tp_comm_dtype="int8", tp_comm_block=32), "float64"),
                ("int8 two-shot", dict(tp_comm_dtype="int8", tp_comm_block=32, tp_comm_exchange="two_shot"),
                 "float64")]
OPTION_TOL = {"float32": LOSS_TOL, "float64": 1e-9}

# model sizes, step counts and time boxes (seconds) per --sizes; 'full' is for one CUDA GPU (the boxes add up
# to 550 s: 440 s inside the 8 minutes a short GPU loan allows, plus cost_calibration's 110 s; a short loan
# can run it alone with --sections=cost_calibration), 'tiny' rehearses every section on CPU (~20 s of CPU
# time; its boxes are wide because a shared CPU host can stretch wall time 5x)
SIZES = {"full": dict(model=dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304),
                      batch_size=12, sim_batch_size=8, tp8_heads=8, warmup=3, iters=10, rounds=3,
                      compile_backend="inductor", prompt_len=128, new_tokens=32, decode_batches=(1, 16),
                      real=dict(block_size=256, batch_size=4), dtype="bfloat16",
                      budget=dict(gpt_train=180, sim_tp8=70, decode=50, real_tp=130, comm_sanity=5,
                                  bf16_identity=45, cost_model=5, cost_calibration=110)),
         "tiny": dict(model=dict(n_layer=4, n_head=8, n_embd=64, block_size=16, vocab_size=128), batch_size=4,
                      sim_batch_size=4, tp8_heads=8, warmup=1, iters=2, rounds=2, compile_backend="eager",
                      prompt_len=8, new_tokens=4, decode_batches=(1, 16), real=dict(block_size=16,
                                                                                    batch_size=2),
                      dtype="bfloat16", budget=dict(gpt_train=120, sim_tp8=60, decode=60, real_tp=180,
                                                    comm_sanity=5, bf16_identity=60, cost_model=5,
                                                    cost_calibration=60)),}

DEFAULTS = dict(
    sizes="full",  # 'full' (GPT-2 124M, one CUDA GPU, ~6 min) | 'tiny' (every section on CPU in seconds)
    device="auto",  # 'auto': cuda if there is one, else cpu
    out_dir=os.path.join(ROOT, "docs"),  # gpu.json and the generated section of gpu.md go here
    sections="all",  # 'all' or a comma-separated subset of SECTIONS
    worker="",  # internal: 'real_tp' runs one rank of the 2-process check (under torch.distributed.run)
    worker_out="",  # internal: where rank 0 of the worker writes its JSON
)


def model_args(size, **changes):
    return {**size["model"], "bias": False, "dropout": 0.0, **changes}


def interleaved(runs, size, batch_size, device, ctx):
    """{name: best seconds per step} of several (run, model) pairs timed in rounds, one after another in each
    round (as bench.py does, so that machine noise hits all alike); each gets its own AdamW and its warm-up
    steps (where a compiled one compiles) in the first round."""
    cfg = size["model"]
    g = torch.Generator().manual_seed(1337)
    X = torch.randint(cfg["vocab_size"], (batch_size, cfg["block_size"]), generator=g).to(device)
    Y = torch.randint(cfg["vocab_size"], (batch_size, cfg["block_size"]), generator=g).to(device)
    device_type = torch.device(device).type
    opts = {name: model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), device_type) for name,
            (_, model) in runs.items()}
    best = {}
    for r in range(size["rounds"]):
        for name, (run, model) in runs.items():
            if r == 0:
                timed_steps(run, model, opts[name], ctx, X, Y, size["warmup"], device)
            dt = timed_steps(run, model, opts[name], ctx, X, Y, size["iters"], device)
            best[name] = min(best.get(name, dt), dt)
    return best


# ---------- the sections: each takes the check's state and returns a dict of results ----------

def gpt_train(st):
    """GPT eager and compiled: ms/iter, tokens/s, MFU; the graphs dynamo compiled and its graph breaks."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from model import device_peak_flops
    from tpcomm.train.build import build_model

    size, device = st["size"], st["device"]
    torch.manual_seed(1337)
    model = build_model("gpt", model_args(size)).to(device)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend=size["compile_backend"])
    best = interleaved({"eager": (model, model), "compiled": (compiled, model)}, size, size["batch_size"],
                       device, st["ctx"])
    tokens = size["batch_size"] * size["model"]["block_size"]
    out = dict(params=model.get_num_params(), batch_size=size["batch_size"], tokens_per_iter=tokens,
               compile_backend=size["compile_backend"], peak_flops=device_peak_flops(device, size["dtype"]),
               compiled_graphs=int(counters["stats"]["unique_graphs"]),
               graph_breaks=int(sum(counters["graph_break"].values())))
    for mode, dt in best.items():
        mfu = model.estimate_mfu(size["batch_size"], dt, device=device, dtype=size["dtype"])
        out[mode] = dict(ms_per_iter=dt * 1e3, tokens_per_s=tokens / dt, mfu=mfu)
    out["ok"] = out["compiled_graphs"] == 1 and out["graph_breaks"] == 0
    return out


def sim_tp8(st):
    """Simulated DistributedGPT at tp 8, one block type throughout, against GPT in the same rounds."""
    from tpcomm.train.build import build_model

    size, device = st["size"], st["device"]
    args = model_args(size, n_head=size["tp8_heads"])
    runs = {}
    torch.manual_seed(1337)
    gpt = build_model("gpt", args).to(device)
    runs["gpt"] = (gpt, gpt)
    for kind in COMPRESSIBLE_TYPES:
        torch.manual_seed(1337)
        m = build_model("distributed_gpt", dict(args, tp_size=8, block_types=kind)).to(device)
        runs[kind] = (m, m)
    best = interleaved(runs, size, size["sim_batch_size"], device, st["ctx"])
    return dict(tp_size=8, n_head=size["tp8_heads"], batch_size=size["sim_batch_size"], compile=False,
                ms_per_iter={k: v * 1e3 for k, v in best.items()},
                ratio_to_gpt={k: best[k] / best["gpt"] for k in COMPRESSIBLE_TYPES})


def decode_ms(model, *, batch, prompt_len, new_tokens, vocab_size, device, ctx):
    """(prefill ms, ms per decoded token) of one greedy generation with the KV cache, device synchronised."""
    from model import KVCache

    prompt = torch.randint(vocab_size, (batch, prompt_len),
                           generator=torch.Generator().manual_seed(0)).to(device)
    cache = KVCache(model.config.n_layer, prompt_len + new_tokens)
    with torch.no_grad(), ctx:
        sync(device)
        t0 = time.perf_counter()
        logits, _ = model(prompt, kv_cache=cache)
        token = logits[:, -1].argmax(-1, keepdim=True)
        sync(device)
        t1 = time.perf_counter()
        for _ in range(new_tokens):
            logits, _ = model(token, kv_cache=cache)
            token = logits[:, -1].argmax(-1, keepdim=True)
        sync(device)
        t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3 / new_tokens


def decode(st):
    """KV-cache decode ms/token of GPT, all 'tp' and all 'spd' (simulated tp 8), each
    batch size, best of rounds."""
    from tpcomm.train.build import build_model

    size, device = st["size"], st["device"]
    args = model_args(size, n_head=size["tp8_heads"])
    models = {}
    torch.manual_seed(1337)
    models["gpt"] = build_model("gpt", args).to(device).eval()
    for kind in ("tp", "spd"):
        torch.manual_seed(1337)
        models[kind] = build_model("distributed_gpt", dict(args, tp_size=8,
                                                           block_types=kind)).to(device).eval()
    kw = dict(prompt_len=size["prompt_len"], vocab_size=size["model"]["vocab_size"], device=device,
              ctx=st["ctx"])
    best = {}
    for _ in range(size["rounds"]):
        for name, model in models.items():
            for b in size["decode_batches"]:
                decode_ms(model, batch=b, new_tokens=2, **kw)  # warm-up
                t = decode_ms(model, batch=b, new_tokens=size["new_tokens"], **kw)
                best[name, b] = min(best.get((name, b), t), t, key=lambda x: x[1])
    return dict(tp_size=8, prompt_len=size["prompt_len"], new_tokens=size["new_tokens"],
                rows=[dict(model=name, batch=b, prefill_ms=best[name, b][0], ms_per_token=best[name, b][1])
                      for name in models for b in size["decode_batches"]])


def real_tp(st):
    """Launch the 2-rank worker (torch.distributed.run, gloo) and keep its results
    for real_tp and comm_sanity."""
    out = os.path.join(st["tmp"], "real_tp.json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
           "tpcomm.gpu.gpu_check", "--worker=real_tp", f"--sizes={st['sizes']}", f"--device={st['device']}",
           f"--worker_out={out}"]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    limit = st["size"]["budget"]["real_tp"] - 5
    code, log = launch(cmd, env=env, timeout=limit)
    if code is None:
        raise SectionTimeout(f"the 2-process worker timed out after {limit} s")
    if code != 0 or not os.path.exists(out):
        raise RuntimeError(f"the 2-process worker failed (exit {code}): {log[-600:]}")
    with open(out) as f:
        res = json.load(f)
    st["comm_sanity"] = res.get("comm_sanity")
    if "error" in res["real_tp"]:
        raise RuntimeError(res["real_tp"]["error"])
    return res["real_tp"]


def comm_sanity(st):
    """The 64 MiB all-reduce check, measured by the real_tp worker (it needs 2 ranks)."""
    res = st.get("comm_sanity")
    if res is None:
        raise RuntimeError("no measurement: it runs inside the real_tp section's worker, which did not "
                           "report")
    if "error" in res:
        raise RuntimeError(res["error"])
    return res


def stream_deviation(model, idx, ctx):
    """Largest |stream entering ln_f - embedding output| of one forward pass under ctx."""
    seen = {}
    h1 = model.transformer.drop.register_forward_hook(lambda m, a, out: seen.__setitem__("embed",
                                                                                         out.float()))
    h2 = model.transformer.ln_f.register_forward_pre_hook(lambda m, a: seen.__setitem__("final",
                                                                                        a[0].float()))
    try:
        with torch.no_grad(), ctx:
            model(idx)
    finally:
        h1.remove()
        h2.remove()
    return (seen["final"].reshape(seen["embed"].shape) - seen["embed"]).abs().max().item()


def bf16_identity(st):
    """Zeroed c_proj everywhere: under bf16 autocast each model (sequence parallel too) must give ln_f the
    embedding unchanged, and in training passes (gradients on) each option's loss must be GPT's
    (tpcomm.gpu.bf16_identity)."""
    from tpcomm.gpu.bf16_identity import train_grid, train_loss, zero_c_proj
    from tpcomm.train.build import build_model
    from tpcomm.train.runtime import autocast_context

    size, device = st["size"], st["device"]
    # 4 layers (one of each block type's transitions is enough; the defect is per block), biases on: c_proj's
    # zeroed too. A 1024-token vocabulary: the embedding and head play no part in the stream's rounding,
    # and 19 models with GPT-2's 50304 would take most of the section's time box. Built on the device, not
    # moved there.
    args = dict(model_args(size, n_head=size["tp8_heads"], n_layer=4, bias=True),
                vocab_size=min(1024, size["model"]["vocab_size"]))
    ctx = autocast_context(torch.device(device).type, "bfloat16")
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(args["vocab_size"], (2, args["block_size"]), generator=g).to(device)

    def build(name, **over):
        torch.manual_seed(0)
        with torch.device(device):
            return zero_c_proj(build_model(name, dict(args, **over)))

    dev = {"gpt": stream_deviation(build("gpt"), idx, ctx)}
    for tp in (2, 4, 8):
        for kind in COMPRESSIBLE_TYPES:
            dev[f"{kind} tp{tp}"] = stream_deviation(build("distributed_gpt", tp_size=tp, block_types=kind),
                                                     idx, ctx)
        # sequence parallel ('ladder' refuses it): a synced and a desynced stream entering each block that
        # syncs
        for pattern in (["spd", "parallel", "tp", "parallel"], ["parallel", "spd", "parallel", "tp"]):
            m = build("distributed_gpt", tp_size=tp, block_types=pattern, sequence_parallel=True)
            dev[f"{pattern} tp{tp} sequence parallel"] = stream_deviation(m, idx, ctx)
    # training passes: the same models with each option the validator allows, loss - GPT's loss
    targets = torch.roll(idx, -1, dims=1)
    want = train_loss(build("gpt"), idx, targets, ctx)
    train = train_grid(lambda tp, block_types, options: build("distributed_gpt", tp_size=tp,
                                                              block_types=block_types, **options), want, idx,
                       targets, ctx, n_layer=4)
    worst = max(*dev.values(), *train.values())
    return dict(dtype="bfloat16", max_deviation=dev, train_loss_deviation=train, worst=worst, ok=worst == 0.0)


def cost_model(st):
    """The cost model's assumed MFU and its compute-term step time beside what gpt_train measured."""
    from tpcomm.costmodel.cost_model import LINKS, Shape, const, step_seconds

    m = st["results"].get("gpt_train", {})
    mode = "compiled" if "compiled" in m else "eager" if "eager" in m else None
    measured = m[mode] if mode else {}
    out = dict(assumed_mfu=const("mfu"), measured_mfu=measured.get("mfu"), measured_from=mode,
               peak_flops=m.get("peak_flops"))
    if mode and m.get("peak_flops"):
        size = st["size"]["model"]
        shape = Shape("gpt_train", size["n_layer"], size["n_embd"], size["n_head"], size["vocab_size"])
        compute, _ = step_seconds(shape, tp=1, link=LINKS[0], tokens=m["tokens_per_iter"],
                                  seq_len=size["block_size"], mfu=const("mfu"), fwd_syncs=0,
                                  peak=m["peak_flops"])
        out.update(predicted_ms_per_iter=compute * 1e3, measured_ms_per_iter=measured["ms_per_iter"],
                   error_pct=100 * (compute * 1e3 - measured["ms_per_iter"]) / measured["ms_per_iter"])
    return out


RUNNERS = dict(gpt_train=gpt_train, sim_tp8=sim_tp8, decode=decode, real_tp=real_tp, comm_sanity=comm_sanity,
               bf16_identity=bf16_identity, cost_model=cost_model, cost_calibration=cost_calibration)


# ---------- the 2-rank worker ----------

def real_tp_worker(cfg):
    """One of 2 ranks: real tp 2 (this rank's shards, gloo) against the simulation (both shards
    here) from the same weights and batches, REAL_STEPS AdamW steps per pattern; then the all-reduce
    sanity check. Rank 0 writes."""
    from tpcomm.train.build import build_model
    from tpcomm.parallel.parallel_dims import init_parallel, shutdown

    size = SIZES[cfg["sizes"]]
    device = cfg["device"]
    if device.startswith("cuda"):
        torch.cuda.set_device(0)  # both ranks on the one GPU
        torch.backends.cuda.matmul.allow_tf32 = False  # real and simulated must round alike (TF32: ~1e-3)
        torch.backends.cudnn.allow_tf32 = False
    # gloo for the group (it reduces CUDA tensors through the host); the mesh on 'cpu' so nothing asks NCCL
    pd = init_parallel(dp=1, tp=2, device_type="cpu", backend="gloo")
    res = {}
    try:
        try:
            res["real_tp"] = compare_real_sim(pd, size, device)
        except Exception as e:  # noqa: BLE001 (recorded, and the sanity check still runs)
            res["real_tp"] = dict(error=f"{type(e).__name__}: {e}")
        try:
            torch.manual_seed(0)
            m = build_model("distributed_gpt", dict(model_args(size, n_head=size["tp8_heads"]), tp_size=2,
                                                    block_types="tp"), pd=pd)
            res["comm_sanity"] = dict(allreduce_sanity(m.group, device), backend="gloo", ranks=2)
        except Exception as e:  # noqa: BLE001
            res["comm_sanity"] = dict(error=f"{type(e).__name__}: {e}")
        if pd.is_master:
            write_json(res, cfg["worker_out"])
    finally:
        shutdown(pd, finished=True)


def compare_real_sim(pd, size, device):
    from tpcomm.train.build import build_model

    cfg = dict(model_args(size, n_head=size["tp8_heads"]), block_size=size["real"]["block_size"])
    L, B, T, V = cfg["n_layer"], size["real"]["batch_size"], cfg["block_size"], cfg["vocab_size"]
    device_type = torch.device(device).type

    def losses_of(opts, steps, dtype):
        """{'real': [...], 'simulated': [...]}: the same weights and batches, `steps` AdamW steps each."""
        losses = {}
        for mode, p in (("real", pd), ("simulated", None)):
            torch.manual_seed(1337)
            model = build_model("distributed_gpt", dict(cfg, tp_size=2, **opts), pd=p).to(device, dtype)
            opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), device_type)
            g = torch.Generator().manual_seed(7)
            losses[mode] = []
            for _ in range(steps):
                X = torch.randint(V, (B, T), generator=g).to(device)
                _, loss = model(X, X)
                loss.backward()
                model.sync_replicated_grads()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses[mode].append(loss.item())
        return dict(losses, max_abs_diff=max(abs(a - b) for a, b in zip(losses["real"], losses["simulated"])))

    every = (list(COMPRESSIBLE_TYPES) * L)[:L]
    patterns = [every, (["ladder", "tp", "spd", "parallel"] * L)[:L]]  # ends ladder / desynced
    out = dict(tp_size=2, backend="gloo", dtype=REAL_DTYPE, steps=REAL_STEPS, tolerance=REAL_TOL, patterns={},
               option_steps=OPTION_STEPS, options={})
    for pattern in patterns:
        out["patterns"][str(pattern)] = losses_of(dict(block_types=pattern), REAL_STEPS,
                                                  getattr(torch, REAL_DTYPE))
    for name, opts, dtype in OPTION_CASES:
        opts = dict(opts, block_types=(list(opts.get("block_types", COMPRESSIBLE_TYPES)) * L)[:L])
        r = losses_of(opts, OPTION_STEPS, getattr(torch, dtype))
        tol = OPTION_TOL[dtype]
        out["options"][name] = dict(r, dtype=dtype, tolerance=tol, ok=r["max_abs_diff"] <= tol)
    out["max_abs_diff"] = max(p["max_abs_diff"] for p in out["patterns"].values())
    out["ok"] = out["max_abs_diff"] <= REAL_TOL and all(o["ok"] for o in out["options"].values())
    return out


# ---------- output ----------


# ---------- the check ----------

def validate(cfg):
    if cfg["sizes"] not in SIZES:
        raise ConfigError(f"sizes must be one of {sorted(SIZES)}, got {cfg['sizes']!r}")
    if cfg["device"] != "auto" and cfg["device"] != "cpu" and not str(cfg["device"]).startswith("cuda"):
        raise ConfigError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {cfg['device']!r}")
    if cfg["sections"] != "all":
        names = [n for n in str(cfg["sections"]).split(",") if n]
        bad = [n for n in names if n not in SECTIONS]
        if bad or not names:
            raise ConfigError(f"sections must be 'all' or a comma-separated subset of {list(SECTIONS)}, got "
                              f"{cfg['sections']!r}")
    if cfg["worker"] not in ("", "real_tp"):
        raise ConfigError(f"worker is internal ('' or 'real_tp'), got {cfg['worker']!r}")
    if cfg["worker"]:
        if "RANK" not in os.environ:  # gpu_check starts it under torch.distributed.run
            raise ConfigError(f"worker={cfg['worker']!r} is internal: gpu_check launches it under torchrun "
                              "itself")
        return
    check_out_dir(cfg)


def is_docs(out_dir):
    return os.path.realpath(out_dir) == os.path.realpath(os.path.join(ROOT, "docs"))


def check_out_dir(cfg):
    """out_dir: an existing, writable folder whose gpu.json (if any) is gpu_check's own. The committed figures
    in docs/ are replaced only by the full check on a GPU, or some of their sections by the same check's
    sections on a GPU of the same name (run_check: mergeable); a rehearsal goes elsewhere."""
    out_dir = cfg["out_dir"]
    if not isinstance(out_dir, str) or not os.path.isdir(out_dir):
        raise ConfigError(f"out_dir must be an existing directory, got {out_dir!r}")
    check_folder(out_dir, key="out_dir", value=out_dir)
    if is_docs(out_dir) and (cfg["sizes"] != "full" or cfg["device"] == "cpu"):  # a rehearsal
        raise ConfigError(f"out_dir={out_dir!r} holds the committed GPU figures: sizes={cfg['sizes']!r}, "
                          f"device={cfg['device']!r}, sections={cfg['sections']!r} is not the full check "
                          "on a GPU; " f"give --out_dir=<another folder> (e.g. /tmp)")
    check_output_file(os.path.join(out_dir, "gpu.json"), key="out_dir", own=json_with("schema", "sections"))


def run_check(cfg, *, say=print):
    """Every selected section in order, each time-boxed and failure-isolated; returns
    the report (also written)."""
    from tpcomm.train.runtime import autocast_context, pick_device, setup_runtime

    device = pick_device(cfg["device"])
    if device == "mps":
        raise ConfigError("device: gpu_check runs on 'cuda' or 'cpu', got mps")
    device_type = torch.device(device).type
    if cfg["sizes"] == "full" and device_type != "cuda":
        raise ConfigError(f"sizes='full' needs a CUDA GPU, got device={device!r} (torch {torch.__version__}, "
                          "CUDA " f"available: {torch.cuda.is_available()}); the CPU rehearsal is "
                          "--sizes=tiny --device=cpu")
    size = SIZES[cfg["sizes"]]
    if device_type == "cuda" and cfg["sizes"] == "full" and not torch.cuda.is_bf16_supported():
        size = dict(size, dtype="float16")
    from model import device_peak_flops

    names = SECTIONS if cfg["sections"] == "all" else [n for n in SECTIONS if n in cfg["sections"].split(",")]
    cuda = device_type == "cuda"
    report = dict(schema=1, sizes=cfg["sizes"], device=device, device_name=torch.cuda.get_device_name(device)
                  if cuda else "CPU (rehearsal)", torch=torch.__version__, cuda=torch.version.cuda,
                  date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  peak_flops=device_peak_flops(device, size["dtype"]), dtype=size["dtype"], git=git_state(),
                  sections={})
    base = read_report(os.path.join(cfg["out_dir"], "gpu.json")) if cfg["sections"] != "all" else None
    if cfg["sections"] != "all" and is_docs(cfg["out_dir"]) and not mergeable(base, report):
        raise ConfigError(f"sections={cfg['sections']!r}: docs/gpu.json is not a full check on "
                          f"{report['device_name']} at sizes={cfg['sizes']!r}, so these sections cannot "
                          "replace its own; run the full check")
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        st = dict(size=size, sizes=cfg["sizes"], device=device, tmp=tmp, results=report["sections"],
                  ctx=autocast_context(device_type, size["dtype"]))
        for name in names:
            setup_runtime(device_type, 1337)
            budget = size["budget"][name]
            t0 = time.perf_counter()
            try:
                with time_box(budget):
                    result = RUNNERS[name](st)
                result = dict(result, error=None)
            except Exception as e:  # noqa: BLE001 (one failing section must not stop the others)
                result = dict(error=f"{type(e).__name__}: {e}".strip())
            result["seconds"] = time.perf_counter() - t0
            report["sections"][name] = result
            status = f"error: {result['error'][:200]}" if result["error"] else \
                "ok" if result.get("ok", True) else "CHECK FAILED"
            say(f"gpu_check: {name}: {status} ({result['seconds']:.1f} s)")
            if cuda:
                torch.cuda.empty_cache()
    report["total_s"] = time.perf_counter() - t_all
    written = merge_sections(base, report) if base is not None and mergeable(base, report) else report
    write_json(written, os.path.join(cfg["out_dir"], "gpu.json"))
    write_markdown(written, os.path.join(cfg["out_dir"], "gpu.md"))
    say(f"gpu_check: wrote {os.path.join(cfg['out_dir'], 'gpu.json')} and gpu.md ({report['total_s']:.0f} s)")
    return report


@exit_on_config_error
def main(argv):
    cfg = configure(DEFAULTS, argv)
    validate(cfg)
    if cfg["worker"] == "real_tp":
        return real_tp_worker(cfg)
    run_check(cfg)


if __name__ == "__main__":
    main(sys.argv[1:])
