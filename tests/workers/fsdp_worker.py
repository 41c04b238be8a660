"""
FSDP2 over the dp dimension (data_parallel.apply_data_parallel(kind='fsdp')) against one process, under
torchrun on CPU with gloo, all checks in one launch (run by tests/parallel/test_fsdp.py):
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=4 \
        tests/workers/fsdp_worker.py --tp=2 out.json
dp = world / tp. tp=1: GPT and simulated-TP DistributedGPT sharded over dp; tp=2: real TP, each rank's tp
shards sharded further over dp. Results as in real_tp_worker.py: `ratio` <= 1 means
assert_close passes at the tolerance.
"""

import os
import sys

import torch
import torch.distributed as dist

# the repository
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tpcomm.parallel.data_parallel import apply_data_parallel, set_gradient_sync  # noqa: E402
from model import GPT  # noqa: E402
from tpcomm.model.interface import PlainGPT  # noqa: E402
from tpcomm.parallel.parallel_dims import init_parallel, shutdown  # noqa: E402
from real_tp_worker import VOCAB, make_gpt, ratio, simulated, write_results  # noqa: E402
from tensor_parallel_model import DistributedGPT  # noqa: E402
from tpcomm.model.options import TPConfig  # noqa: E402

# float64 throughout: FSDP's reduce-scatter, DDP's all-reduce and one process's sums add the same terms in
# other orders, ~1e-16 relative per operation (measured <1e-14 after 3 steps); a wrong shard or a missing
# reduction moves results by >1e-3. Adam turns a gradient's rounding into a weight difference of up to its own
# size, hence 1e-8.
TOL = dict(rtol=1e-8, atol=1e-8)
STEPS, MICRO, LR, CLIP = 3, 4, 1e-2, 0.1  # MICRO global micro-batches of one row per step; clipping active
PATTERN = ["parallel", "tp", "parallel", "spd"]  # desynced streams into tp and spd blocks


def data(step, micro=MICRO):
    g = torch.Generator().manual_seed(200 + step)
    return [(torch.randint(VOCAB, (1, 24), generator=g), torch.randint(VOCAB, (1, 24), generator=g))
            for _ in range(micro)]


def build(kind, gpt, pd, *, meta=False):
    """GPT, or DistributedGPT with tp_size 2 (real when the grid has a tp dimension),
    as a float64 copy of gpt."""
    if kind == "gpt":
        model = PlainGPT(gpt.config)
        model.load_state_dict(gpt.state_dict())
        return model.double()
    return DistributedGPT.from_gpt(gpt, 2, PATTERN, pd=pd).double()


def train(model, run, pd, *, dp, micro=MICRO):
    """STEPS AdamW steps with clipping over `micro` global micro-batches each; this replica takes
    micro-batches dp_rank, dp_rank + dp, ... of each step (gradient sync on its last one only). Returns losses
    (mean over all micro-batches), norms, weights, moments."""
    optimizer = model.configure_optimizers(0.1, LR, (0.9, 0.95), "cpu")
    mine = list(range(pd.dp_rank if dp > 1 else 0, micro, dp))
    losses, norms = [], []
    for step in range(STEPS):
        batches = data(step, micro)
        total = torch.zeros((), dtype=torch.float64)
        for k, m in enumerate(mine):
            set_gradient_sync(run, enabled=k == len(mine) - 1)
            _, loss = run(*batches[m])
            (loss / len(mine)).backward()
            total += loss.detach()
        model.sync_replicated_grads()
        norms.append(float(model.clip_grad_norm_(CLIP)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if dp > 1:
            dist.all_reduce(total, group=pd.dp_group)
        losses.append(float(total) / micro)
    moments = {f"{i}/{k}": v for i, s in model.gpt_optimizer_state(optimizer)["state"].items()
               for k, v in s.items() if k != "step"}
    return dict(losses=torch.tensor(losses, dtype=torch.float64), norms=torch.tensor(norms,
                                                                                     dtype=torch.float64),
                weights=model.gpt_state_dict(), moments=moments)


def one_process(gpt, kinds, *, micro=MICRO):
    """train() of one process (no dp) for each kind, the runs the dp ones are compared with; each computed by
    one rank and sent to all (real_tp_worker.simulated), as every rank would compute the same."""
    def run(kind):
        one = build(kind, gpt, None)
        return train(one, one, None, dp=1, micro=micro)

    return dict(zip(kinds, simulated([lambda kind=kind: run(kind) for kind in kinds])))


def compare(a, b):
    out = {k: ratio(a[k], b[k], TOL) for k in ("losses", "norms", "weights", "moments")}
    out["ratio"] = max(v["ratio"] for v in out.values())
    out["losses"]["values"] = [a["losses"].tolist(), b["losses"].tolist()]
    return out


def meta_init_under_fsdp(gpt, pd):
    """DistributedGPT built on the meta device, sharded by fully_shard over pd's mesh (FSDP or
    HSDP), then materialised: (the model, GPT's init of the same seed, whether the model's full
    state equals it bitwise)."""
    torch.manual_seed(3)
    ref_sd = GPT(gpt.config).state_dict()
    torch.manual_seed(3)
    with torch.device("meta"):
        meta = DistributedGPT(TPConfig(**vars(gpt.config), tp_size=2, block_types=PATTERN), pd=pd, init=False)
    apply_data_parallel(meta, pd, kind="fsdp", device_type="cpu")
    meta.materialize_("cpu")
    sd = meta.gpt_state_dict()
    return meta, ref_sd, sd.keys() == ref_sd.keys() and all(torch.equal(sd[k], ref_sd[k]) for k in ref_sd)


def main(argv):
    tp = int(argv[0].split("=", 1)[1])
    out_path = argv[1]
    pd = init_parallel(dp=int(os.environ["WORLD_SIZE"]) // tp, tp=tp, device_type="cpu", backend="gloo")
    finished = False
    try:
        gpt, results = make_gpt(), {}
        kinds = ["gpt", "distributed_gpt"] if pd.tp == 1 else ["distributed_gpt"]
        refs = one_process(gpt, kinds)
        for kind in kinds:
            ref = refs[kind]
            model = build(kind, gpt, pd)
            run = apply_data_parallel(model, pd, kind="fsdp", device_type="cpu")
            results[f"fsdp/{kind}"] = compare(train(model, run, pd, dp=pd.dp), ref)
            # the comparison can fail: one weight changed on the last dp rank's shard before training
            model = build(kind, gpt, pd)
            if pd.dp_rank == pd.dp - 1:
                with torch.no_grad():
                    model.transformer.h[1].mlp.c_fc.weight[-1, 0] += 0.1  # a row of this rank's FSDP shard
            run = apply_data_parallel(model, pd, kind="fsdp", device_type="cpu")
            results[f"can_fail/fsdp/{kind}"] = compare(train(model, run, pd, dp=pd.dp), ref)
        # meta-device init, then FSDP, then materialise: every rank holds only its shards, bitwise GPT's init
        meta, ref_sd, exact = meta_init_under_fsdp(gpt, pd)
        name = "transformer.h.0.mlp.c_fc.weight"
        tp_rows = meta.sharding.local_shape(name, ref_sd[name].shape)[0]  # 4C, or 4C/2 with real TP
        results["fsdp/meta_init_exact"] = dict(ok=exact)
        results["fsdp/meta_init_holds_its_shard"] = dict(  # this rank's FSDP shard of its tp part, no more
            ok=meta.transformer.h[0].mlp.c_fc.weight.to_local().shape[0] == tp_rows // pd.dp)
        write_results(pd, results, out_path)
        finished = True
    finally:
        shutdown(pd, finished=finished)


if __name__ == "__main__":
    main(sys.argv[1:])
