"""
Pipeline parallelism (tpcomm/parallel/pipeline.py) against one process, run under torchrun on CPU with gloo by
tests/parallel/test_pipeline.py, all checks of a world size in one launch:
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=4 \
        tests/workers/pp_worker.py out.json
Every layout of LAYOUTS[world] runs on the same processes (each builds its own (pp, dp, tp) mesh). Rank 0
writes, per check, the worst result over all ranks; a comparison is `ratio`, the largest |pp - ref| /
(atol + rtol |ref|) over all compared elements (see real_tp_worker.ratio): ratio <= 1 is
torch.testing.assert_close passing.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

# the repository
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from model import GPT, GPTConfig  # noqa: E402
from tpcomm.model.interface import PlainGPT  # noqa: E402
from tpcomm.parallel.pipeline import LADDER, SCHEDULES, build_pipeline  # noqa: E402
from tpcomm.parallel.pipeline_timeline import bubble_fraction, theoretical_bubble  # noqa: E402
from tpcomm.parallel.parallel_dims import init_parallel  # noqa: E402
from real_tp_worker import ratio, simulated, worst  # noqa: E402
from tensor_parallel_model import DistributedGPT  # noqa: E402

VOCAB, N_LAYER, N_HEAD, N_EMBD, T = 61, 8, 4, 32, 16
M, MB = 4, 2  # micro-batches per step and rows per micro-batch (per dp replica)
TP_SIZE = 2  # DistributedGPT's tp_size: simulated inside each stage, or real over a tp group of 2 ranks
MODELS = {
    "gpt": None,  # plain GPT: its stream is x (b, T, C)
    # every even split cuts after a 'parallel' block: the pair (xbar, r) crosses; the model ends desynced
    "desync_cut": ["spd", "parallel"] * 4,
    # splits of 2 and 4 layers cut after 'tp'/'spd' (synced, their input desynced); the last block is
    # 'parallel'
    "ends_desync": ["parallel", "tp", "parallel", "spd", "parallel", "tp", "spd", "parallel"],
    # every cut between two ladder blocks: their pending outputs cross as (u, x); the last block's are added
    # before ln_f on the last stage
    "all_ladder": ["ladder"] * 8,
    # a ladder block before every cut, into 'tp' (pp 2: after layer 3), 'spd', 'tp' and 'parallel' (pp 4 and
    # the interleaved 4 stages: after layers 1, 3, 5): xbar + P_A + P_M crosses; 'parallel' -> 'ladder'
    # (desynced input) inside a stage; ends with pending outputs
    "ladder_cuts": ["tp", "ladder", "spd", "ladder", "tp", "ladder", "parallel", "ladder"],
}
LADDER_KINDS = ("all_ladder", "ladder_cuts")
VIRTUAL = {"gpipe": 1, "1f1b": 1, "interleaved_1f1b": 2}
# float64: pp computes the same sums as one process, only the micro-batch split and the order of a few
# additions differ (~1e-16 relative per operation); 1e-9 leaves room while a wrong term moves results by
# >1e-3. After STEPS AdamW steps 1e-8 (Adam divides by each gradient's own size, amplifying rounding noise in
# tiny elements; see real_tp_worker). float32 (8 processes): losses and gradient norms, rtol 1e-4 as in
# real_tp_worker (measured ~1e-7).
TOL = {"float64": dict(rtol=1e-9, atol=1e-9), "steps/float64": dict(rtol=1e-8, atol=1e-8),
       "steps/float32": dict(rtol=1e-4, atol=1e-5)}
STEPS, LR, CLIP = 3, 1e-2, 0.1  # CLIP below the measured gradient norms: clipping is active (the test checks)
# world size -> layouts (pp, dp, tp processes) run in one launch, with the checks of each
LAYOUTS = {2: [(2, 1, 1)], 4: [(4, 1, 1), (2, 1, 2), (2, 2, 1)], 8: [(2, 2, 2)]}
RESUMED = ((2, 1, 1), (2, 1, 2), (2, 2, 1))  # the layouts whose checkpoints are resumed (check_resume)


def f64(values):
    """Python floats as a float64 tensor (torch.tensor would round them to float32)."""
    return torch.tensor(values, dtype=torch.float64)


def make_gpt():
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(block_size=T, vocab_size=VOCAB, n_layer=N_LAYER, n_head=N_HEAD, n_embd=N_EMBD,
                        bias=True))
    with torch.no_grad():  # non-zero biases and norms, so a bias added the wrong number of times shows
        for p in gpt.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return gpt


def make_model(gpt, kind, dtype, dims=None):
    """A fresh copy of the reference weights: GPT, or DistributedGPT of the pattern
    (real tp when dims.tp > 1)."""
    if MODELS[kind] is None:
        model = PlainGPT(gpt.config)
        model.load_state_dict(gpt.state_dict())
    else:
        real = dims is not None and dims.tp > 1
        model = DistributedGPT.from_gpt(gpt, TP_SIZE, MODELS[kind], pd=dims if real else None)
    return model.to(dtype)


def data(dp):
    """STEPS global batches (dp * M * MB rows), the same on every rank."""
    g = torch.Generator().manual_seed(7)
    return [(torch.randint(VOCAB, (dp * M * MB, T), generator=g), torch.randint(VOCAB, (dp * M * MB, T),
                                                                                generator=g))
            for _ in range(STEPS)]


def reference(gpt, kind, dtype, batches):
    """One process on each whole batch: mean loss, backward, clip, AdamW (as train.py without pp)."""
    model = make_model(gpt, kind, dtype)
    optimizer = model.configure_optimizers(0.1, LR, (0.9, 0.95), "cpu")
    losses, norms, grads = [], [], None
    for X, Y in batches:
        _, loss = model(X, Y)
        loss.backward()
        if grads is None:
            grads = {n: p.grad.clone() for n, p in model.named_parameters(remove_duplicate=False)}
        norms.append(model.clip_grad_norm_(CLIP).item())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return dict(losses=f64(losses), norms=f64(norms), grads=grads, weights=model.state_dict(),
                moments=moments(model.gpt_optimizer_state(optimizer)),
                groups=optimizer.state_dict()["param_groups"])


def moments(opt_state):
    return {f"{i}/{k}": v for i, s in opt_state["state"].items() for k, v in s.items() if k != "step"}


def pipelined(gpt, kind, dtype, batches, dims, schedule, *, tamper=None, rows=None):
    """The same steps through this rank's pipeline; this dp replica takes its rows of each global batch."""
    model = make_model(gpt, kind, dtype, dims)
    pipe = build_pipeline(model, dims, schedule=schedule, n_microbatches=M, batch_size=M * MB, seq_len=T,
                          virtual_stages=VIRTUAL[schedule])
    if tamper is not None:
        tamper(pipe)
    optimizer = pipe.configure_optimizers(0.1, LR, (0.9, 0.95), "cpu")
    rows = rows or slice(dims.dp_rank * M * MB, (dims.dp_rank + 1) * M * MB)
    losses, norms, grads = [], [], None
    for X, Y in batches:
        x, y = X[rows], Y[rows]
        pipe.reset_comm_counts()
        losses.append(pipe.step([(x[i * MB:(i + 1) * MB], y[i * MB:(i + 1) * MB]) for i in range(M)]))
        if grads is None:
            grads = pipe.gpt_grads()
        norms.append(pipe.clip_grad_norm_(CLIP).item())
        optimizer.step()
    opt_state = pipe.gpt_optimizer_state(optimizer)
    events = pipe.comm.gather_events()
    actions = {r: [(k, s, m) for k, s, m, _ in ev if k in ("F", "B")] for r, ev in events.items()}
    report = pipe.comm_report(tokens=MB * T)
    return dict(losses=f64(losses), norms=f64(norms), grads=grads, weights=pipe.gpt_state_dict(),
                moments=moments(opt_state), groups=opt_state["param_groups"], bubble=bubble_fraction(actions),
                report=report, layers=pipe.layers)


def compare(pp, ref, dtype, keys=("losses", "grads", "norms", "weights", "moments")):
    out = {}
    for k in keys:
        out[k] = ratio(pp[k], ref[k], TOL[dtype] if k == "grads" else TOL[f"steps/{dtype}"])
    out["ratio"] = max(v["ratio"] for v in out.values())
    out["losses"]["values"] = [pp["losses"].tolist(), ref["losses"].tolist()]
    out["norms"] = dict(out.get("norms", {}), values=[pp["norms"].tolist(), ref["norms"].tolist()])
    return out


def references(gpt, world):
    """The one-process runs a launch compares with, keyed (kind, dtype, dp), each computed by one rank
    and sent to all (real_tp_worker.simulated). They depend on the layout only through dp (the global
    batch), so the layouts share them: every rank computing those of each layout it ran made 44 runs of 7
    different ones at 4 processes."""
    keys = []
    for pp, dp, tp in LAYOUTS[world]:
        for dtype, kinds, *_ in plan(pp, dp, tp):
            keys += [(kind, dtype, dp) for kind in kinds]
        if (pp, dp, tp) in RESUMED:
            keys.append(("desync_cut", "float64", dp))
    keys = list(dict.fromkeys(keys))
    runs = [lambda kind=kind, dtype=dtype, dp=dp: reference(gpt, kind, getattr(torch, dtype), data(dp))
            for kind, dtype, dp in keys]
    return dict(zip(keys, simulated(runs)))


def check_layout(gpt, dims, results, launch_refs, *, kinds, schedules, dtype, keys, can_fail):
    """launch_refs: references(), of which those of this dtype and dp are compared with."""
    name = f"pp{dims.pp}_dp{dims.dp}_tp{dims.tp}"
    batches = data(dims.dp)
    refs = {kind: launch_refs[kind, dtype, dims.dp] for kind in kinds}
    for kind in kinds:
        for schedule in schedules:
            pp = pipelined(gpt, kind, getattr(torch, dtype), batches, dims, schedule)
            res = compare(pp, refs[kind], dtype, keys)
            res["groups_equal"] = [g["params"] for g in pp["groups"]] == [g["params"]
                                                                          for g in refs[kind]["groups"]]
            res.update(bubble=pp["bubble"], theory=theoretical_bubble(dims.pp, M, VIRTUAL[schedule]),
                       boundaries=pp["report"]["pp_boundaries"], layers=pp["layers"],
                       tp_fwd_allreduces=pp["report"].get("fwd_allreduces"),
                       tp_bwd_allreduces=pp["report"].get("bwd_allreduces"))
            results[f"{name}/{dtype}/{kind}/{schedule}"] = res
    # each comparison can fail: the same steps with one thing broken must not match
    schedule, tdtype = schedules[-1], getattr(torch, dtype)
    for label in can_fail:
        tamper, rows = CAN_FAIL[label], None
        kind = CAN_FAIL_KIND.get(label, [k for k in kinds if k not in LADDER_KINDS][-1])
        if label == "one_replica_rows":  # every replica on replica 0's rows: DDP averages the wrong gradients
            tamper, rows = None, slice(0, M * MB)
        results[f"{name}/can_fail/{label}"] = compare(pipelined(gpt, kind, tdtype, batches, dims, schedule,
                                                                tamper=tamper, rows=rows), refs[kind], dtype)


def no_tied_sum(pipe):  # the tied weight's two gradients left apart
    pipe.sync_grads = lambda: pipe.model.sync_replicated_grads()


def perturbed_last_stage(pipe):  # one weight changed on the last stage's ranks only
    if pipe.has_last:
        with torch.no_grad():
            pipe.modules[-1].transformer.h[-1].attn.c_proj.weight[0, 0] += 0.1


def unscaled(pipe):  # the micro-batch gradients summed, not averaged
    pipe.schedule.scale_grads = False


def no_tp_grad_sync(pipe):  # block-replicated parameters' partial gradients not summed over tp
    pipe.model.sync_replicated_grads = lambda: None


def on_cut(pipe, change):
    """Every local stage's outgoing stream changed: change(module, its leave, xbar, r,
    pending) -> what it sends."""
    for module in pipe.modules:
        module.leave = lambda xbar, r, pending, module=module, leave=module.leave: change(module, leave, xbar,
                                                                                          r, pending)


# a ladder block's pending outputs not added at the cut (kept in autograd, times 0)
def pending_lost_at_cut(pipe):
    def lost(p):
        return p._replace(value=0 * p.value, bias=None if p.bias is None else 0 * p.bias)

    on_cut(pipe, lambda module, leave, xbar, r, pending: leave(xbar, r, tuple(lost(p) for p in pending)))


def x_for_u_at_cut(pipe):  # x alone crosses a ladder -> ladder cut: the next attention reads x instead of u
    def change(module, leave, xbar, r, pending):
        out = leave(xbar, r, pending)
        return (out[1].clone(), out[1]) if module.stream_out == LADDER else out

    on_cut(pipe, change)


CAN_FAIL = dict(no_tied_sum=no_tied_sum, perturbed_last_stage=perturbed_last_stage, unscaled=unscaled,
                no_tp_grad_sync=no_tp_grad_sync, one_replica_rows=None,
                pending_lost_at_cut=pending_lost_at_cut, x_for_u_at_cut=x_for_u_at_cut)
# the others: the last kind
CAN_FAIL_KIND = dict(pending_lost_at_cut="ladder_cuts", x_for_u_at_cut="all_ladder")


def plan(pp, dp, tp):
    """What runs on a layout: [(dtype, kinds, schedules, keys compared, broken variants)]. 8 processes on 2
    cores are slow: fp32 losses and norms of both patterns, fp64 in full for the desynced cut; pp2 x dp2 skips
    the patterns and broken variants other layouts cover. The ladder patterns run at pp 2 (alone and x tp 2
    real): the interleaved schedule's 4 stages give them the cuts pp 4 would."""
    ladder = (pp, dp) == (2, 1)
    kinds = [k for k in MODELS if (tp == 1 or MODELS[k] is not None) and (ladder or k not in LADDER_KINDS)]
    applies = dict(no_tied_sum=pp > 1, perturbed_last_stage=pp > 1, unscaled=True, no_tp_grad_sync=tp > 1,
                   one_replica_rows=dp > 1, pending_lost_at_cut=ladder, x_for_u_at_cut=ladder)
    broken = [n for n in CAN_FAIL if applies[n]]
    full = ("losses", "grads", "norms", "weights", "moments")
    if (pp, dp, tp) == (2, 2, 2):
        return [("float32", kinds, ["1f1b"], ("losses", "norms"), []),
                ("float64", ["desync_cut"], ["interleaved_1f1b"], full, ["perturbed_last_stage",
                                                                         "one_replica_rows"])]
    if dp > 1:
        return [("float64", ["gpt", "desync_cut"], list(SCHEDULES), full,
                 ["perturbed_last_stage", "one_replica_rows"])]
    return [("float64", kinds, list(SCHEDULES), full, broken)]


def check_resume(gpt, dims, results, launch_refs):
    """Checkpoint round trip: GPT-layout weights and optimizer state after 2 steps, loaded into a fresh
    pipeline, then a 3rd step equals the uninterrupted one process's 3rd step."""
    kind, schedule, dtype = "desync_cut", "1f1b", torch.float64
    batches = data(dims.dp)
    ref = launch_refs[kind, "float64", dims.dp]
    first = make_model(gpt, kind, dtype, dims)
    pipe = build_pipeline(first, dims, schedule=schedule, n_microbatches=M, batch_size=M * MB, seq_len=T)
    optimizer = pipe.configure_optimizers(0.1, LR, (0.9, 0.95), "cpu")
    rows = slice(dims.dp_rank * M * MB, (dims.dp_rank + 1) * M * MB)

    def mbs(X, Y):
        return [(X[rows][i * MB:(i + 1) * MB], Y[rows][i * MB:(i + 1) * MB]) for i in range(M)]

    for X, Y in batches[:2]:
        pipe.step(mbs(X, Y))
        pipe.clip_grad_norm_(CLIP)
        optimizer.step()
    weights, opt_state = pipe.gpt_state_dict(), pipe.gpt_optimizer_state(optimizer)
    torch.manual_seed(123)  # the fresh model's own init differs: only the loaded state can make it match
    fresh = make_model(PlainGPT(gpt.config), kind, dtype, dims)
    pipe = build_pipeline(fresh, dims, schedule=schedule, n_microbatches=M, batch_size=M * MB, seq_len=T)
    optimizer = pipe.configure_optimizers(0.1, LR, (0.9, 0.95), "cpu")
    pipe.load_gpt_state_dict(weights)
    pipe.load_gpt_optimizer_state(optimizer, opt_state)
    # evaluation through the pipeline before any training step (train.py evaluates at iteration 0): the loss
    # of one process holding the gathered weights
    one = make_model(gpt, kind, dtype)
    one.load_gpt_state_dict(weights)
    with torch.no_grad():
        eval_ref = one(*batches[2])[1] if dims.dp == 1 else one(batches[2][0][rows], batches[2][1][rows])[1]
    eval_loss = pipe.train(False).eval_loss(mbs(*batches[2]))
    pipe.train(True)
    loss = pipe.step(mbs(*batches[2]))
    pipe.clip_grad_norm_(CLIP)
    optimizer.step()
    if dims.dp > 1:  # the replicas' eval losses averaged: the mean over the global batch
        eval_ref = eval_ref.clone()
        dist.all_reduce(eval_ref, group=dims.dp_group)
        eval_ref /= dims.dp
    out = {"eval_loss": ratio(f64(eval_loss), eval_ref, TOL["float64"]),
           "loss": ratio(f64(loss), ref["losses"][2], TOL["steps/float64"]),
           "weights": ratio(pipe.gpt_state_dict(), ref["weights"], TOL["steps/float64"]),
           "moments": ratio(moments(pipe.gpt_optimizer_state(optimizer)), ref["moments"],
                            TOL["steps/float64"])}
    out["ratio"] = max(v["ratio"] for v in out.values())
    results[f"pp{dims.pp}_dp{dims.dp}_tp{dims.tp}/resume"] = out


def main(argv):
    out_path = argv[0]
    world = int(os.environ["WORLD_SIZE"])
    results, gpt = {}, make_gpt()
    dist.init_process_group(backend="gloo")
    try:
        refs = references(gpt, world)
        for pp, dp, tp in LAYOUTS[world]:
            dims = init_parallel(dp=dp, tp=tp, pp=pp, device_type="cpu")
            assert (dims.pp, dims.dp, dims.tp) == (pp, dp, tp)
            for dtype, kinds, schedules, keys, broken in plan(pp, dp, tp):
                check_layout(gpt, dims, results, refs, kinds=kinds, schedules=schedules, dtype=dtype,
                             keys=keys, can_fail=broken)
            if (pp, dp, tp) in RESUMED:
                check_resume(gpt, dims, results, refs)
        per_rank = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, results)
        if dist.get_rank() == 0:
            with open(out_path, "w") as f:
                json.dump(dict(world=world, results=merge(per_rank)), f, indent=1)
    finally:
        dist.destroy_process_group()


def merge(per_rank):
    """worst() for the ratios; the measured bubble and bytes of pp rank 0 of the
    first replica (global rank 0)."""
    merged = worst(per_rank)
    for k, v in per_rank[0].items():
        for extra in ("bubble", "theory", "boundaries", "layers", "tp_fwd_allreduces", "tp_bwd_allreduces",
                      "groups_equal"):
            if extra in v:
                merged[k][extra] = v[extra]
        if "groups_equal" in v:
            merged[k]["groups_equal"] = all(r[k]["groups_equal"] for r in per_rank)
    return merged


if __name__ == "__main__":
    main(sys.argv[1:])
