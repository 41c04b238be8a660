"""
Real tensor parallelism (one shard per process) against the simulation (every shard in one process), run under
torchrun on CPU with gloo by tests/tp/test_real_tp.py, all checks in one launch:
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=4 \
        tests/workers/real_tp_worker.py \
        --dp=2 out.json
Every rank runs the same checks; rank 0 writes, per check, the worst result over all ranks. A comparison
is reported as `ratio`, the largest |real - sim| / (atol + rtol * |sim|) over all elements of all
compared tensors: ratio <= 1 is exactly torch.testing.assert_close passing at that tolerance. The
assertions live in the test file.
"""

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

# the repository
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tpcomm.train.runtime import make_grad_scaler  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from tpcomm.model.interface import PlainGPT  # noqa: E402
from tpcomm.parallel.parallel_dims import init_parallel, shutdown  # noqa: E402
from tensor_parallel_model import DistributedGPT  # noqa: E402
from tpcomm.model.options import TPConfig  # noqa: E402

VOCAB, N_LAYER, N_HEAD, N_EMBD = 61, 4, 8, 32
PATTERNS = [
    ["tp"] * 4,
    ["spd"] * 4,
    ["parallel"] * 4,  # ends desynced: one final sync
    ["parallel", "tp", "parallel", "spd"],  # a desynced stream entering 'tp' and 'spd' blocks
    ["tp", "spd", "spd", "parallel"],  # ends desynced after synced blocks
]
# Real and simulated runs add the same terms in another order (per-rank matmuls and an all-reduce instead of
# batched matmuls and a sum over shards). float64: ~1e-16 relative per operation, measured <1e-15 on logits
# and gradients; 1e-9 leaves room while a wrong term moves results by >1e-3. float32: ~1e-7..1e-6 (as in
# test_tensor_parallel.py), so 2e-5. After STEPS AdamW steps: Adam divides each gradient by its own size, so
# an element whose gradient is tiny turns fp32 rounding noise into a visible weight difference (measured up to
# 7e-5 at tp=4); weights and moments are therefore compared in float64 (measured <1e-12, tolerance 1e-8), and
# the fp32 runs compare what train.py logs: losses and gradient norms (measured <1e-6 relative, tolerance
# 1e-4).
TOL = {"float64": dict(rtol=1e-9, atol=1e-9), "float32": dict(rtol=2e-5, atol=2e-5),
       "steps/float64": dict(rtol=1e-8, atol=1e-8), "steps/float32": dict(rtol=1e-4, atol=1e-5)}
STEPS, LR, CLIP = 5, 1e-2, 0.1  # CLIP is below the gradient norms measured here, so clipping is active


def make_gpt(seed=0):
    torch.manual_seed(seed)
    gpt = GPT(GPTConfig(block_size=32, vocab_size=VOCAB, n_layer=N_LAYER, n_head=N_HEAD, n_embd=N_EMBD,
                        bias=True))
    # non-zero biases and norms, so a bias added or summed the wrong number of times shows
    with torch.no_grad():
        for p in gpt.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return gpt


def batch(seed, rows=4):
    g = torch.Generator().manual_seed(100 + seed)
    return torch.randint(VOCAB, (rows, 24), generator=g), torch.randint(VOCAB, (rows, 24), generator=g)


def replica_rows(pd, rows=4):
    """This dp replica's rows of a global batch (the tp ranks of one replica read the same rows)."""
    return slice(pd.dp_rank * rows // pd.dp, (pd.dp_rank + 1) * rows // pd.dp)


def ratio(a, b, tol):
    """max |a - b| / (atol + rtol |b|) over tensors a, b or over dicts of them (same keys); and where."""
    if isinstance(a, torch.Tensor):
        a, b = {"": a}, {"": b}
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    worst, where = 0.0, None
    for k in a:
        x, y = a[k].double(), b[k].double()
        assert x.shape == y.shape, (k, x.shape, y.shape)
        r = ((x - y).abs() / (tol["atol"] + tol["rtol"] * y.abs())).max().item()
        if r > worst or where is None:
            worst, where = r, k
    return dict(ratio=worst, where=where)


def mapped(x, fn):
    """x with fn applied to everything in it that is not a dict, list or tuple."""
    if isinstance(x, dict):
        return {k: mapped(v, fn) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(mapped(v, fn) for v in x)
    return fn(x)


def packed(x):
    """x with every tensor detached and (numpy has no bfloat16) made a numpy array, which pickles as its
    bytes: a tensor pickles as a torch.save archive of its own (~0.25 ms to write and read back: 0.5 s of CPU
    per rank for pp_worker's references)."""
    return mapped(x, lambda v: (v.detach() if v.dtype == torch.bfloat16 else v.detach().numpy())
                  if isinstance(v, torch.Tensor) else v)


def unpacked(x):
    return mapped(x, lambda v: torch.from_numpy(v) if isinstance(v, np.ndarray) else v)


def simulated(runs):
    """[run() for run in runs], each run on one rank and its result sent to all (tensors detached). A
    simulated model's results are the same on every rank (the same weights, inputs, dropout keys and
    seeds), so each rank computes its share of them: every rank running all of them did the simulation's
    work world-size times over."""
    world, rank = dist.get_world_size(), dist.get_rank()
    mine = {i: packed(run()) for i, run in enumerate(runs) if i % world == rank}
    every = [None] * world
    dist.all_gather_object(every, mine)
    return [unpacked(every[i % world][i]) for i in range(len(runs))]


def local_grads(model):
    """Every gradient as this rank holds it (real mode: its part of each tp-sharded parameter)."""
    return {n: p.grad for n, p in model.named_parameters()}


def held_by(model, tensors):
    """GPT-layout tensors (a simulated run's) cut as `model` holds them on this rank (model.gpt_layout_part),
    to be compared with its local ones: over the ranks every element is compared, as when each rank compared
    the gathered tensors, without an all-gather per parameter (~1-2.5 ms of CPU per rank each on gloo at 2 and
    4 processes on 2 cores; they were half of this worker's collectives at tp 4)."""
    return {k: model.gpt_layout_part(k, v) for k, v in tensors.items()}


def forward_backward(model, idx, tgt, *, ddp=None, dropout_key=None):
    model.zero_grad(set_to_none=True)
    model.reset_comm_counts()
    if dropout_key is not None:
        model.seed_dropout(*dropout_key)
    logits, loss = (ddp or model)(idx, tgt)
    loss.backward()
    model.sync_replicated_grads()
    return logits, loss, local_grads(model), model.comm_report(micro_steps=1,
                                                               tokens=idx.numel())["fwd_allreduces"]


def compare_step(real_out, sim_out, tol, real):
    """forward_backward of the real model `real` against the simulated one's (its
    gradients cut as real holds them)."""
    (lr, lossr, gr, fr), (ls, losss, gs, fs) = real_out, sim_out
    out = {"logits": ratio(lr, ls, tol), "loss": ratio(lossr, losss, tol),
           "grads": ratio(gr, held_by(real, gs), tol)}
    out["ratio"] = max(v["ratio"] for v in out.values())
    out["fwd_allreduces"] = [fr, fs]
    return out


def name(block_types):
    return "-".join(block_types)


def check_forward_backward(pd, gpt, results):
    """Logits, loss and every gradient of real vs simulated, for each pattern, fp32 and fp64."""
    idx, tgt = batch(0)
    cases = [(dtype, block_types) for dtype in ("float32", "float64") for block_types in PATTERNS]
    sims = simulated([lambda dtype=dtype, block_types=block_types: forward_backward(
        DistributedGPT.from_gpt(gpt, pd.tp, block_types).to(getattr(torch, dtype)), idx, tgt)
        for dtype, block_types in cases])
    for (dtype, block_types), sim_out in zip(cases, sims):
        real = DistributedGPT.from_gpt(gpt, pd.tp, block_types, pd=pd).to(getattr(torch, dtype))
        results[f"fwd_bwd/{dtype}/{name(block_types)}"] = compare_step(
            forward_backward(real, idx, tgt), sim_out, TOL[dtype], real)
    # every comparison above can fail: a wrong shard, a wrong pattern, or a missing gradient sync is seen
    block_types = ["parallel", "tp", "parallel", "spd"]
    sim_out = sims[cases.index(("float64", block_types))]
    real = DistributedGPT.from_gpt(gpt, pd.tp, block_types, pd=pd).double()
    if pd.tp_rank == pd.tp - 1:
        with torch.no_grad():  # one q weight of the last shard's first head
            real.transformer.h[1].attn.c_attn.weight[0, 3] += 0.1
    results["can_fail/perturbed_shard"] = compare_step(forward_backward(real, idx, tgt), sim_out,
                                                       TOL["float64"], real)
    other = ["parallel", "tp", "parallel", "tp"]
    real = DistributedGPT.from_gpt(gpt, pd.tp, other, pd=pd).double()
    results["can_fail/other_pattern"] = compare_step(forward_backward(real, idx, tgt), sim_out,
                                                     TOL["float64"], real)
    real = DistributedGPT.from_gpt(gpt, pd.tp, block_types, pd=pd).double()
    real.sync_replicated_grads = lambda: None
    results["can_fail/no_grad_sync"] = compare_step(forward_backward(real, idx, tgt), sim_out, TOL["float64"],
                                                    real)


def with_dropout(gpt, p):
    """A copy of gpt whose config has dropout p, in training mode."""
    model = PlainGPT(GPTConfig(**dict(vars(gpt.config), dropout=p)))
    model.load_state_dict(gpt.state_dict())
    return model


def check_dropout(pd, gpt, results):
    """With dropout, masks keyed by (seed, iteration, micro-batch, tp shard): real equals
    simulated. Unkeyed (torch's global RNG, the same state on every rank) every tp rank draws
    the same masks: that must not match."""
    idx, tgt = batch(0)
    dropped = with_dropout(gpt, 0.2)
    cases = [(dtype, block_types) for dtype in ("float32", "float64") for block_types in PATTERNS]
    sims = simulated([lambda dtype=dtype, block_types=block_types: forward_backward(
        DistributedGPT.from_gpt(dropped, pd.tp, block_types).to(getattr(torch, dtype)).train(), idx, tgt,
        dropout_key=(1337, 3, 1)) for dtype, block_types in cases])
    for (dtype, block_types), sim_out in zip(cases, sims):
        real = DistributedGPT.from_gpt(dropped, pd.tp, block_types, pd=pd).to(getattr(torch, dtype)).train()
        results[f"dropout/{dtype}/{name(block_types)}"] = compare_step(
            forward_backward(real, idx, tgt, dropout_key=(1337, 3, 1)), sim_out, TOL[dtype], real)
    block_types = ["parallel", "tp", "parallel", "spd"]
    sim_out = sims[cases.index(("float64", block_types))]
    real = DistributedGPT.from_gpt(dropped, pd.tp, block_types, pd=pd).double().train()
    torch.manual_seed(0)  # unkeyed: every rank's global RNG in the same state, one mask for all shards
    results["can_fail/dropout_unkeyed"] = compare_step(forward_backward(real, idx, tgt), sim_out,
                                                       TOL["float64"], real)


def check_loss_parallel(pd, gpt, results):
    """loss_parallel under real TP (each rank holds its vocabulary rows; VOCAB = 61 is padded):
    the logits, loss and every gradient of the simulated model without it (all-'tp': GPT), and
    the same generated tokens."""
    idx, tgt = batch(0)
    tgt[0, :5] = -1
    prompt = idx[:, :4]

    def sim_run(block_types):
        sim = DistributedGPT.from_gpt(gpt, pd.tp, block_types).double()
        return forward_backward(sim, idx, tgt), sim.eval().generate(prompt, 8, temperature=0)

    patterns = (PATTERNS[0], PATTERNS[3])
    sims = simulated([lambda block_types=block_types: sim_run(block_types) for block_types in patterns])
    for block_types, (sim_out, sim_tokens) in zip(patterns, sims):
        real = DistributedGPT.from_gpt(gpt, pd.tp, block_types, pd=pd, loss_parallel=True).double()
        logits, loss, grads, fwd = forward_backward(real, idx, tgt)
        full = real.gathered_logits(logits, idx.shape)
        results[f"loss_parallel/{name(block_types)}"] = compare_step((full, loss, grads, fwd), sim_out,
                                                                     TOL["float64"], real)
        same = torch.equal(real.eval().generate(prompt, 8, temperature=0), sim_tokens)
        results[f"loss_parallel/generate/{name(block_types)}"] = dict(ok=same)
    real = DistributedGPT.from_gpt(gpt, pd.tp, PATTERNS[0], pd=pd, loss_parallel=True).double()
    if pd.tp_rank == pd.tp - 1:
        with torch.no_grad():  # a row of the last rank's vocabulary shard
            real.lm_head.weight[0, 0] += 0.1
    logits, loss, grads, fwd = forward_backward(real, idx, tgt)
    full = real.gathered_logits(logits, idx.shape)
    results["can_fail/loss_parallel_perturbed_row"] = compare_step((full, loss, grads, fwd), sims[0][0],
                                                                   TOL["float64"], real)


def generations(model, prompt):
    """Tokens of greedy and seeded (top-k) sampling, with and without the KV cache, 4 new ones each."""
    out = []
    for use_cache in (True, False):
        for temperature, top_k in ((0.0, None), (1.0, 20)):
            torch.manual_seed(11)
            out.append(model.generate(prompt, 4, temperature=temperature, top_k=top_k, use_cache=use_cache))
    return out


def check_generation(pd, gpt, results, patterns=PATTERNS, dtype=torch.float32):
    """Generation under real TP gives the single-process model's tokens, greedy and seeded sampling, with and
    without the KV cache, and every tp rank holds the same tokens. 30 prompt tokens and 4 new ones: the
    prefill, cached one-token steps up to the cache's last slot (block_size 32), then a step past it whose
    window slides, so the cache's crop is compared too (KV-cache == recomputing is proven for every block type
    in simulation, tests/model/test_generate.py). 26 and 8 ran four more cached one-token steps before the
    slide, the same code as the two here."""
    prompt = torch.randint(VOCAB, (2, 30), generator=torch.Generator().manual_seed(9))
    sims = simulated([lambda block_types=block_types: generations(
        DistributedGPT.from_gpt(gpt, pd.tp, block_types).to(dtype).eval(), prompt)
                      for block_types in patterns])
    for block_types, sim_tokens in zip(patterns, sims):
        real = DistributedGPT.from_gpt(gpt, pd.tp, block_types, pd=pd).to(dtype).eval()
        ok = True
        for real_tokens, tokens in zip(generations(real, prompt), sim_tokens):
            every = [torch.empty_like(real_tokens) for _ in range(pd.tp)]
            dist.all_gather(every, real_tokens, group=pd.tp_group)
            ok = ok and torch.equal(real_tokens, tokens) and all(torch.equal(e, real_tokens) for e in every)
        results[f"generate/{name(block_types)}"] = dict(ok=ok)


def check_state(pd, gpt, results):
    """The gathered state dict is GPT's, bit for bit (nothing is reduced);
    get_num_params counts the whole model."""
    real = DistributedGPT.from_gpt(gpt, pd.tp, PATTERNS[-1], pd=pd)
    sd, ref = real.gpt_state_dict(), gpt.state_dict()
    exact = sd.keys() == ref.keys() and all(torch.equal(sd[k], ref[k]) for k in ref)
    results["state/gpt_state_dict_exact"] = dict(ok=exact)
    results["state/num_params"] = dict(real=real.get_num_params(), gpt=gpt.get_num_params())
    # meta-device init: each rank materialises only its shards, bitwise GPT's init with the same seed
    for loss_parallel in (False, True):
        torch.manual_seed(3)
        ref = GPT(gpt.config).state_dict()
        torch.manual_seed(3)
        with torch.device("meta"):
            meta = DistributedGPT(TPConfig(**vars(gpt.config), tp_size=pd.tp, block_types=PATTERNS[-1],
                                           loss_parallel=loss_parallel), pd=pd, init=False)
        sd = meta.materialize_("cpu").gpt_state_dict()
        results[f"state/meta_init_exact/loss_parallel={loss_parallel}"] = dict(
            ok=sd.keys() == ref.keys() and all(torch.equal(sd[k], ref[k]) for k in ref))


def train_steps(model, data, *, pd=None, ddp=None, state=True):
    """STEPS AdamW steps with clipping, as train.py does them; per-step loss (mean over dp) and grad norm;
    state: the final weights and AdamW moments too, in GPT's layout (in real mode an all-gather per sharded
    tensor: left out where only losses and norms are compared)."""
    optimizer = model.configure_optimizers(0.1, LR, (0.9, 0.95), "cpu")
    losses, norms = [], []
    for idx, tgt in data:
        _, loss = (ddp or model)(idx, tgt)
        loss.backward()
        model.sync_replicated_grads()
        norms.append(model.clip_grad_norm_(CLIP).item())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss = loss.detach().double()
        if pd is not None and pd.dp > 1:
            dist.all_reduce(loss, group=pd.dp_group)
            loss /= pd.dp
        losses.append(loss.item())
    out = dict(losses=torch.tensor(losses, dtype=torch.float64), norms=torch.tensor(norms,
                                                                                    dtype=torch.float64))
    if state:
        opt_state = model.gpt_optimizer_state(optimizer)["state"]
        out.update(weights=model.gpt_state_dict(),
                   moments={f"{i}/{k}": v for i, s in opt_state.items() for k, v in s.items() if k != "step"})
    return out


def compare_training(a, b, tol, keys=("losses", "norms", "weights", "moments")):
    out = {k: ratio(a[k], b[k], tol) for k in keys}
    out["ratio"] = max(v["ratio"] for v in out.values())
    out["losses"]["values"] = [a["losses"].tolist(), b["losses"].tolist()]
    out["norms"]["values"] = [a["norms"].tolist(), b["norms"].tolist()]
    return out


def check_training(pd, gpt, results, patterns):
    """STEPS optimizer steps: each dp replica takes its rows of the global batch; the simulation takes all."""
    data = [batch(1 + s) for s in range(STEPS)]
    mine = replica_rows(pd)
    local = [(x[mine], y[mine]) for x, y in data]
    compared = (("float64", ("losses", "norms", "weights", "moments")), ("float32", ("losses", "norms")))
    cases = [(dtype, keys, block_types) for dtype, keys in compared for block_types in patterns]
    runs = [lambda dtype=dtype, keys=keys, block_types=block_types: train_steps(
        DistributedGPT.from_gpt(gpt, pd.tp, block_types).to(getattr(torch, dtype)), data,
                                                                                state="weights" in keys)
        for dtype, keys, block_types in cases]
    if pd.dp > 1:  # the data split matters: a simulation on one replica's rows only does not match
        runs.append(lambda: train_steps(DistributedGPT.from_gpt(gpt, pd.tp, patterns[0]).double(),
                                        [(x[:2], y[:2]) for x, y in data]))
    sims = simulated(runs)
    for (dtype, keys, block_types), sim_out in zip(cases, sims):
        real = DistributedGPT.from_gpt(gpt, pd.tp, block_types, pd=pd).to(getattr(torch, dtype))
        ddp = DDP(real, process_group=pd.dp_group) if pd.dp > 1 else None
        results[f"steps/{dtype}/{name(block_types)}"] = compare_training(train_steps(real, local, pd=pd,
                                                                                     ddp=ddp,
                                                                                     state="weights" in keys),
                                                                         sim_out, TOL[f"steps/{dtype}"], keys)
    if pd.dp > 1:
        real = DistributedGPT.from_gpt(gpt, pd.tp, patterns[0], pd=pd).double()
        ddp = DDP(real, process_group=pd.dp_group)
        results["can_fail/one_replica_rows"] = compare_training(train_steps(real, local, pd=pd, ddp=ddp),
                                                                sims[-1], TOL["steps/float64"])


def check_data_parallel(pd, gpt, results):
    """One step of dp replicas (DDP over the dp group) on their rows vs the simulation on the whole batch."""
    idx, tgt = batch(0)
    mine = replica_rows(pd)
    patterns = (PATTERNS[0], PATTERNS[-1])
    sims = simulated([lambda block_types=block_types: forward_backward(
        DistributedGPT.from_gpt(gpt, pd.tp, block_types).double(), idx, tgt) for block_types in patterns])
    for block_types, (s_logits, s_loss, s_grads, s_fwd) in zip(patterns, sims):
        real = DistributedGPT.from_gpt(gpt, pd.tp, block_types, pd=pd).double()
        ddp = DDP(real, process_group=pd.dp_group)
        logits, loss, grads, fwd = forward_backward(real, idx[mine], tgt[mine], ddp=ddp)
        loss = loss.detach().clone()
        dist.all_reduce(loss, group=pd.dp_group)
        results[f"dp_fwd_bwd/{name(block_types)}"] = compare_step(  # mean loss over the global batch
            (logits, loss / pd.dp, grads, fwd), (s_logits[mine], s_loss, s_grads, s_fwd), TOL["float64"],
                                                                  real)


def check_grad_scaler(pd, gpt, results):
    """fp16 loss scaling: an inf in one rank's gradient shard skips the step on every tp rank
    (train.py's scaler); torch.amp.GradScaler alone would step the other ranks and leave the
    replica's shards out of step."""
    for label, scaler_for in (("scaler/inf_on_one_rank_skips_all", lambda: make_grad_scaler("cpu", "float16",
                                                                                            pd)),
                              ("can_fail/plain_scaler", lambda: torch.amp.GradScaler("cpu"))):
        model = DistributedGPT.from_gpt(gpt, pd.tp, ["tp", "spd", "parallel", "tp"], pd=pd)
        optimizer = model.configure_optimizers(0.1, LR, (0.9, 0.95), "cpu")
        scaler = scaler_for()
        before = [p.detach().clone() for p in model.parameters()]
        idx, tgt = batch(0)
        _, loss = model(idx, tgt)
        scaler.scale(loss).backward()
        model.sync_replicated_grads()
        if pd.tp_rank == pd.tp - 1:  # one element of this rank's shard of one MLP weight overflows
            model.transformer.h[1].mlp.c_fc.weight.grad[0, 0] = float("inf")
        scaler.step(optimizer)
        scaler.update()
        stepped = torch.tensor([float(any(not torch.equal(a, p) for a,
                                          p in zip(before, model.parameters())))])
        every = [torch.zeros(1) for _ in range(pd.tp)]
        dist.all_gather(every, stepped, group=pd.tp_group)
        every = [bool(t.item()) for t in every]
        if label.startswith("scaler/"):  # no rank stepped, and every rank backed off its scale alike
            ok = not any(every) and scaler.get_scale() == 65536.0 * 0.5
        else:  # the ranks without the inf stepped: the check above can fail
            ok = every == [True] * (pd.tp - 1) + [False]
        results[label] = dict(ok=ok)


def worst(per_rank):
    """Merge the ranks' results: the largest ratio wins, every rank must be ok."""
    merged = {}
    for res in per_rank:
        for k, v in res.items():
            if k not in merged or v.get("ratio", 0) > merged[k].get("ratio", 0):
                merged[k] = v
            if "ok" in v:
                merged[k] = dict(ok=merged[k]["ok"] and v["ok"])
    return merged


def write_results(pd, results, out_path):
    """Rank 0 writes, per check, the worst result over all ranks (see worst)."""
    per_rank = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, results)
    if pd.is_master:
        with open(out_path, "w") as f:
            json.dump(dict(dp=pd.dp, tp=pd.tp, results=worst(per_rank)), f, indent=1)


def main(argv):
    dp = int(argv[0].split("=", 1)[1])
    out_path = argv[1]
    world = int(os.environ["WORLD_SIZE"])
    pd = init_parallel(dp=dp, tp=world // dp, device_type="cpu", backend="gloo")
    try:
        gpt = make_gpt()
        results = {}
        if pd.dp == 1:
            check_forward_backward(pd, gpt, results)
            check_dropout(pd, gpt, results)
            check_generation(pd, gpt, results)
            check_loss_parallel(pd, gpt, results)
            check_state(pd, gpt, results)
            check_training(pd, gpt, results, PATTERNS)
            check_grad_scaler(pd, gpt, results)
        else:
            check_data_parallel(pd, gpt, results)
            check_training(pd, gpt, results, [PATTERNS[-1], PATTERNS[0]])
        write_results(pd, results, out_path)
    finally:
        shutdown(pd)


if __name__ == "__main__":
    main(sys.argv[1:])
