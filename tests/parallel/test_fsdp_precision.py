"""FSDP2 under bf16 on CUDA: the blocks' parameters are gathered in bf16 and their
gradients reduced in fp32 (torchtitan's policy), the residual stream stays fp32 between blocks, the
root's parameters stay fp32, and training matches one process under the same autocast. fp32 training, and
CPU, keep full precision.

Checked here on 2 gloo processes with CUDA's policy, and CUDA autocast's rule for layer_norm
(computed in fp32, weights included) given to CPU autocast, which lacks it: what the policy relies
on, and nothing else, is CUDA's."""

import os

import pytest
import torch

from test_cuda_path import spawn_gloo


def _batches(vocab, steps, B=4, T=16):
    """One batch, `steps` times: the loss falls step by step (it learns the batch)."""
    g = torch.Generator().manual_seed(0)
    return [(torch.randint(vocab, (B, T), generator=g), torch.randint(vocab, (B, T), generator=g))] * steps


def _train(model, run, batches, rows, ctx):
    opt = model.configure_optimizers(0.1, 3e-2, (0.9, 0.95), "cpu")
    losses = []
    for X, Y in batches:
        with ctx:
            _, loss = run(X[rows], Y[rows])
        loss.backward()
        model.sync_replicated_grads()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _fsdp_bf16(rank, world, model_type):
    from torch.nn import functional as F

    from tpcomm.train.build import build_model
    from tpcomm.parallel.data_parallel import apply_data_parallel
    from tpcomm.parallel.parallel_dims import init_parallel
    from tpcomm.train.runtime import autocast_context

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    pd = init_parallel(dp=world, tp=1, device_type="cpu")
    args = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=65, bias=True, dropout=0.0,
                tp_size=2, block_types=["tp", "spd"])
    batches, ctx = _batches(65, 3), autocast_context("cpu", "bfloat16")
    layer_norm = F.layer_norm

    # CUDA autocast's fp32 list has it
    def cuda_autocast_layer_norm(x, shape, weight=None, bias=None, eps=1e-5):
        if torch.is_autocast_enabled("cpu"):
            x, weight, bias = (None if t is None else t.float() for t in (x, weight, bias))
        return layer_norm(x, shape, weight, bias, eps)

    F.layer_norm = cuda_autocast_layer_norm
    torch.manual_seed(0)
    ref = build_model(model_type, args)
    ref_losses = _train(ref, ref, batches, slice(None), ctx)  # one process, the whole batch

    torch.manual_seed(0)
    model = build_model(model_type, args)
    run = apply_data_parallel(model, pd, kind="fsdp", device_type="cuda", dtype="bfloat16")  # CUDA's policy
    seen = {}
    block = model.transformer.h[0]
    block.register_forward_pre_hook(lambda m, a: seen.update(
        gathered=str(next(m.parameters()).dtype), stream_in=str(a[0].dtype)))
    block.register_forward_hook(lambda m, a, out: seen.update(
        stream_out=str((out[0] if isinstance(out, tuple) else out).dtype)))
    model.register_forward_pre_hook(lambda m, a: seen.update(root=str(m.transformer.wte.weight.dtype)))
    rows = slice(rank * 2, rank * 2 + 2)  # this rank's half of each batch
    losses = _train(model, run, batches, rows, ctx)
    t = torch.tensor(losses, dtype=torch.float64)
    torch.distributed.all_reduce(t)  # the mean over dp of the half-batch means: the whole batch's mean
    with ctx:
        _, loss = run(batches[0][0][rows], batches[0][1][rows])
    loss.backward()
    grad = next(model.transformer.h[0].parameters()).grad
    return dict(ref=ref_losses, fsdp=(t / world).tolist(), grad_dtype=str(grad.dtype),
                sharded_dtype=str(next(model.transformer.h[0].parameters()).dtype), **seen)


@pytest.fixture(scope="module", params=["gpt", "distributed_gpt"])
def bf16(request, tmp_path_factory):
    return spawn_gloo(_fsdp_bf16, 2, tmp_path_factory.mktemp("fsdp_bf16"), request.param)[0]


def test_blocks_gather_in_bf16_the_stream_and_root_stay_fp32(bf16):
    assert bf16["gathered"] == "torch.bfloat16", bf16  # a block's parameters as its forward sees them
    # not rounded at the block's edges
    assert bf16["stream_in"] == bf16["stream_out"] == "torch.float32", bf16
    assert bf16["root"] == "torch.float32", bf16  # embeddings: the stream starts fp32
    # fp32 master weights and gradients
    assert bf16["sharded_dtype"] == bf16["grad_dtype"] == "torch.float32", bf16


def test_fsdp_bf16_trains_as_one_process_under_bf16_autocast(bf16):
    # the same autocast math up to where FSDP rounds what autocast would not (layer-norm weights, biases added
    # outside a matmul) and bf16's own noise: agreement to ~1e-3 of a loss of ~4.2, changes ~1e-1 per step
    ref, fsdp = bf16["ref"], bf16["fsdp"]
    assert ref[-1] < ref[0] - 0.05  # it trained
    for a, b in zip(ref, fsdp):
        assert abs(a - b) < 5e-3, (ref, fsdp)


def test_fp32_training_and_cpu_keep_full_precision():
    from tpcomm.parallel.data_parallel import mixed_precision_policies

    for dtype, device_type in ((None, "cuda"), ("float32", "cuda"), ("bfloat16", "cpu"), ("float16", "mps")):
        for policy in mixed_precision_policies(dtype, device_type):
            assert policy.param_dtype is None and policy.reduce_dtype is None
    blocks, root = mixed_precision_policies("float16", "cuda")
    assert (blocks.param_dtype, blocks.reduce_dtype, blocks.cast_forward_inputs) == (torch.float16,
                                                                                     torch.float32, False)
    assert root.param_dtype is None and root.reduce_dtype == torch.float32
