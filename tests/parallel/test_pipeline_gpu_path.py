"""The pipeline's GPU path, checked on CPU with 2 gloo processes (pp 2): checkpoint
gathers move tensors by broadcasts, never pickled through all_gather_object, and give each stage's own values;
the stages are moved to the device, not the whole model (on a GPU; skipped without one)."""

import os

import pytest
import torch

from test_cuda_path import spawn_gloo


def _tensors_in(obj):
    if torch.is_tensor(obj):
        return True
    if isinstance(obj, dict):
        return any(_tensors_in(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_tensors_in(v) for v in obj)
    return False


def _pipeline(rank, world, model_type, device="cpu"):
    from tpcomm.train.build import build_model
    from tpcomm.parallel.parallel_dims import init_parallel
    from tpcomm.parallel.pipeline import Pipeline

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    dims = init_parallel(dp=1, tp=1, pp=world, device_type="cpu")
    torch.manual_seed(0)
    args = dict(n_layer=4, n_head=2, n_embd=16, block_size=8, vocab_size=33, bias=True, dropout=0.0,
                tp_size=2, block_types=["tp", "parallel", "spd", "tp"])
    model = build_model(model_type, args)  # whole, on the CPU, on every rank
    pipe = Pipeline(model, dims, schedule="1f1b", n_microbatches=2, batch_size=4, seq_len=8, device=device)
    return dims, model, pipe


def _gather(rank, world, model_type):
    import torch.distributed as dist

    dims, model, pipe = _pipeline(rank, world, model_type)
    reference = {k: v.clone() for k, v in model.state_dict().items()}  # the same init on every rank
    with torch.no_grad():  # make each stage's values its own: stage r's parameters + (r + 1)
        for p in pipe.parameters():
            p.add_(rank + 1)
    pickled = []
    gather_object = dist.all_gather_object

    def watched(out, obj, group=None):
        pickled.append(_tensors_in(obj))
        return gather_object(out, obj, group=group)

    dist.all_gather_object = watched
    try:
        state = pipe.gpt_state_dict()
        g = torch.Generator().manual_seed(1)
        X = torch.randint(33, (4, 8), generator=g)
        opt = pipe.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
        pipe.step([(X[:2], X[:2]), (X[2:], X[2:])])
        opt.step()
        optimizer = pipe.gpt_optimizer_state(opt)
    finally:
        dist.all_gather_object = gather_object
    first_stage = {n for n, _ in pipe.named_parameters()} if rank == 0 else None
    offsets = {}
    for k, v in state.items():
        d = v - reference[k]  # (ref + c) - ref is c up to fp32 rounding of ref + c: 1e-6 here
        offsets[k] = [round(d.mean().item(), 3)] if torch.allclose(d, d.mean().expand_as(d),
                                                                   atol=1e-5) else None
    n_params = len(list(model.parameters()))
    return dict(keys=list(state), ref_keys=list(reference), offsets=offsets, pickled_tensors=any(pickled),
                gathers=len(pickled), devices=sorted({str(v.device) for v in state.values()}),
                first_stage=sorted(first_stage) if first_stage else None,
                optimizer_entries=sorted(optimizer["state"]), n_params=n_params,
                moment_shapes_ok=all(tuple(optimizer["state"][i]["exp_avg"].shape) == tuple(p.shape)
                                     for i, p in enumerate(_gpt_order(model)) if i in optimizer["state"]))


def _gpt_order(model):
    named = list(model.named_parameters())
    return [p for _, p in named if p.dim() >= 2] + [p for _, p in named if p.dim() < 2]


@pytest.fixture(scope="module", params=["gpt", "distributed_gpt"])
def gathered(request, tmp_path_factory):
    return spawn_gloo(_gather, 2, tmp_path_factory.mktemp("pp_gather"), request.param)


def test_checkpoint_gather_pickles_no_tensors(gathered):
    for r in gathered:
        assert r["gathers"] >= 2 and not r["pickled_tensors"], r  # metadata only (keys, shapes, dtypes)


def test_checkpoint_gather_gives_each_stages_values_on_every_rank(gathered):
    r0, r1 = gathered
    # GPT's keys; the same on both ranks
    assert r0["keys"] == r0["ref_keys"] and r0["offsets"] == r1["offsets"]
    first = set(r0["first_stage"])
    for k, off in r0["offsets"].items():
        # the first stage's entries carry its +1, the second stage's their +2; the tied weight is wte on the
        # first and lm_head on the last, each stage's copy under its own name (training keeps them equal)
        assert off == [1.0 if k in first else 2.0], (k, off)
    assert r0["devices"] == ["cpu"]
    assert r0["optimizer_entries"] == list(range(r0["n_params"])) and r0["moment_shapes_ok"]


def _moved(rank, world, device):
    """Which of the model's parameters are on `device` after the Pipeline is built, and which are its stages',
    by the parameters themselves: the last stage's untied head is lm_head.weight in the model and wte's name
    in the stage (the checkpoint's key), so names would not match."""
    dims, model, pipe = _pipeline(rank, world, "gpt", device=device)
    name = {id(p): n for n, p in model.named_parameters()}
    on_device = {id(p) for p in model.parameters() if p.device.type == torch.device(device).type}
    local = {id(p) for p in pipe.parameters()}
    return dict(on_device=sorted(name[i] for i in on_device), local=sorted(name.get(i, "?") for i in local),
                n_params=len(name))


def _check_moved(results):
    for r in results:
        assert r["on_device"] == r["local"], r  # this rank's stages, and nothing else, on its device
        assert 0 < len(r["on_device"]) < r["n_params"], r  # the other stages stayed on the CPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_only_the_stages_move_to_the_gpu(tmp_path):
    _check_moved(spawn_gloo(_moved, 2, tmp_path, "cuda:0"))


def test_only_the_stages_move_to_the_device_rehearsed_on_meta(tmp_path):
    """The same on the meta device, without a GPU (the placement logic is the device's business alone); and
    the check fails when the whole model is moved."""
    results = spawn_gloo(_moved, 2, tmp_path, "meta")
    _check_moved(results)
    whole = [dict(r, on_device=sorted(set(r["on_device"]) | {"lm_head.weight", "transformer.wte.weight"}))
             for r in results]
    with pytest.raises(AssertionError):
        _check_moved(whole)
