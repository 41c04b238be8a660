"""
Collective matmul (tp_collective_matmul; docs/overlap.md): sequence parallelism's all-gather before a
column-parallel GEMM and reduce-scatter after a row-parallel GEMM, each decomposed into tp ring steps of
peer-to-peer transfers, the transfer of one step running while the GEMM of another computes (what PyTorch's
async TP in torchtitan and Transformer Engine's tp-comm-overlap run; there on SymmetricMemory / userbuffers,
here on torch.distributed isend/irecv).

    all_gather_matmul     (N/tp, C) token shard x, W (L, C, K) -> (L, N, K) = gather(x) @ W_i (+ b_i)
                          backward: the input gradient by matmul_reduce_scatter's ring, W's from gathered x
    matmul_reduce_scatter (L, N, K) y, W (L, K, C) -> this rank's (N/tp, C) rows of sum_i y_i @ W_i
                          backward: the gradient all-gathered by all_gather_matmul's ring, into y's and W's

The ring (tp ranks, N = tp chunks of n = N/tp tokens; rank j sends to j-1 and receives from j+1):
    all-gather    step s: rank j holds chunk (j + s) % tp, sends it on while multiplying it
    reduce-scat.  step s: rank j multiplies its part of chunk (j + s + 1) % tp, adds the sum received for that
                  chunk (sent on at step s - 1 while this GEMM ran) and sends it on; after tp steps it holds
                  chunk j's sum
Simulated (one process, every shard): the same steps in the same order, the sums in the ring's order,
each transfer counted. Counted as kind 'p2p' (tpcomm/tp/counting.py): one count per transfer, its bytes
what one rank sends, so a ring moves (tp - 1)/tp of the whole buffer that the all-gather or
reduce-scatter it replaces is counted as.
"""

import torch
import torch.distributed as dist

from tpcomm.tp.collectives import in_autocast_dtype
from tpcomm.tp.sharded_layers import layer_norm
from tpcomm.tp.counting import P2P, SP_LABEL, Timing, count_sp, direction_now, nbytes, traced


def _transfer(group, send, site, op):
    """Step of the ring: send `send` to rank j-1, receive as much from rank j+1 (real); counted, traced, and
    timed into the counter (real: its issue and its wait exposed, issue to the end of the wait in
    collectives). Returns (received buffer, works, step) to finish with _finish."""
    direction = direction_now()
    size = count_sp(group, direction, P2P, nbytes(send))
    span = (group, op, direction, site, size)
    if not group.real:
        with traced(*span, collective=SP_LABEL[P2P]):
            return None, (), (span, None)
    tp, j = group.tp, group.first_shard
    recv = torch.empty_like(send)
    clock = group.clock_for(send)
    start = clock.now()
    with traced(*span, collective=SP_LABEL[P2P]):
        works = [dist.isend(send, group=group.group, group_dst=(j - 1) % tp),
                 dist.irecv(recv, group=group.group, group_src=(j + 1) % tp)]
    return recv, works, (span, (clock, start, clock.now()))


def _finish(works, step):
    """Wait for a step's transfer (the span 'wait ring_p2p ...', so a trace pairs it with its issue)."""
    span, marks = step
    with traced(*span, waiting=True, collective=SP_LABEL[P2P]):
        w0 = marks and marks[0].now()
        for w in works:
            w.wait()
    if marks is not None:
        clock, start, issued = marks
        span[0].counter.add_timing(Timing(clock, span[2], start, issued, waited=(w0, clock.now())))


def ring_all_gather_matmul(x, w, b, group, site, op="ag"):
    """(out (L, N, K), gathered x (N, C)): gather(x) @ w_i (+ b_i) with each chunk's transfer beside a GEMM.
    x: this rank's (n, C) token shard (simulated: every shard, (N, C)); w (L, C, K); b (L, 1, K) or None."""
    tp, L = group.tp, w.shape[0]
    n = x.shape[0] // (1 if group.real else tp)
    N = n * tp
    out = x.new_empty(L, N, w.shape[-1])
    full = x.new_empty(N, x.shape[1]) if group.real else x
    for i in range(L):  # simulated: each shard's ring in turn (real: the one shard of this rank)
        j = group.first_shard + i
        cur = x if group.real else None
        for s in range(tp):
            c = (j + s) % tp
            held = cur if group.real else x[c * n:(c + 1) * n]
            step = _transfer(group, held, site, op) if s < tp - 1 and i == 0 else None
            rows = slice(c * n, (c + 1) * n)
            out[i, rows] = held @ w[i] if b is None else torch.addmm(b[i], held, w[i])  # beside the transfer
            if group.real:
                full[rows] = held
            if step is not None:
                recv, works, marks = step
                _finish(works, marks)
                cur = recv
    return out, full


def ring_matmul_reduce_scatter(y, w, group, site, op="rs"):
    """This rank's (n, C) rows of sum_i y_i @ w_i (simulated: every shard's rows, (N, C)), each partial sum's
    transfer beside the next chunk's GEMM. y (L, N, K), w (L, K, C)."""
    tp, N = group.tp, y.shape[1]
    n = N // tp
    if not group.real:
        return _simulated_reduce_scatter(y, w, group, site, op)
    j = group.first_shard
    acc, step = None, None
    for s in range(tp):
        c = (j + s + 1) % tp
        part = y[0, c * n:(c + 1) * n] @ w[0]  # beside the transfer of the previous step's sum
        if step is not None:
            recv, works, marks = step
            _finish(works, marks)
            part = part + recv
        acc = part
        step = _transfer(group, acc.contiguous(), site, op) if s < tp - 1 else None
    return acc


def _simulated_reduce_scatter(y, w, group, site, op):
    """The ring of ring_matmul_reduce_scatter for every rank at once: chunk c's sum starts at
    rank c-1 and gathers ranks c-2, ..., c in that order (part + received, as the real ring
    adds); tp - 1 transfers counted."""
    tp, N = group.tp, y.shape[1]
    n = N // tp
    out = y.new_empty(N, w.shape[-1])
    for c in range(tp):
        rows = slice(c * n, (c + 1) * n)
        acc = None
        for s in range(tp):
            rank = (c - s - 1) % tp
            part = y[rank, rows] @ w[rank]
            acc = part if acc is None else part + acc
        out[rows] = acc
    for _ in range(tp - 1):  # what one rank sends: (n, C) per step
        _finish(*_transfer(group, out[:n], site, op)[1:])
    return out


class _AllGatherMatmul(torch.autograd.Function):
    """f and the column-parallel GEMM fused: forward the all-gather ring; backward the input gradient by the
    reduce-scatter ring (grad @ w_i^T), the weight gradient from the gathered input saved by the forward."""

    @staticmethod
    def forward(ctx, x, w, b, group, site):
        out, full = ring_all_gather_matmul(x, w, b, group, site)
        ctx.save_for_backward(full, w)
        ctx.group, ctx.site, ctx.has_bias = group, site, b is not None
        return out

    @staticmethod
    def backward(ctx, grad):  # grad (L, N, K)
        full, w = ctx.saved_tensors
        grad = grad.contiguous()
        gx = ring_matmul_reduce_scatter(grad, w.transpose(1, 2), ctx.group, ctx.site)
        gw = full.t().unsqueeze(0) @ grad  # (L, C, K)
        gb = grad.sum(1, keepdim=True) if ctx.has_bias else None
        return gx, gw, gb, None, None


class _MatmulReduceScatter(torch.autograd.Function):
    """The row-parallel GEMM and g fused: forward the reduce-scatter ring; backward the all-gather ring of the
    gradient, multiplied by w_i^T on the way (y's gradient), the gathered gradient giving w's."""

    @staticmethod
    def forward(ctx, y, w, group, site):
        ctx.save_for_backward(y, w)
        ctx.group, ctx.site = group, site
        return ring_matmul_reduce_scatter(y, w, group, site)

    @staticmethod
    def backward(ctx, grad):  # grad (n, C) (simulated: (N, C))
        y, w = ctx.saved_tensors
        gy, full = ring_all_gather_matmul(grad.contiguous(), w.transpose(1, 2), None, ctx.group, ctx.site)
        gw = y.transpose(1, 2) @ full  # (L, K, C)
        return gy, gw, None, None


def all_gather_matmul(x, w, b, group, *, site=None):
    """(N/tp, C) token shard (simulated: (N, C)) -> (L, N, K) = gather(x) @ w_i + b_i, w (L, C, K), b (L, 1,
    K) or None; plain sequence parallelism's gather_to_tp_region followed by the bmm, as one ring."""
    x, w = in_autocast_dtype(x), in_autocast_dtype(w)
    b = None if b is None else in_autocast_dtype(b)
    return _AllGatherMatmul.apply(x.contiguous(), w, b, group, site)


def matmul_reduce_scatter(y, w, group, *, site=None):
    """(L, N, K) -> this rank's (N/tp, C) rows of sum_i y_i @ w_i (simulated: (N, C)), w (L, K, C): the bmm
    followed by plain sequence parallelism's reduce_scatter_from_tp_region, as one ring."""
    return _MatmulReduceScatter.apply(in_autocast_dtype(y).contiguous(), in_autocast_dtype(w), group, site)


def collective_matmul_block(block, x, T, kv):
    """A 'tp' block (tpcomm/model/block_types/tp.py) under sequence parallelism with each all-gather fused
    with the GEMM after it and each reduce-scatter with the GEMM before it (TP.equations' synced path under
    sequence parallelism, its LN, bias and dropout as there): x (N/tp, C) this rank's token shard (simulated:
    (N, C)) -> the block's output shard."""
    group, sites, attn, mlp = block.group, block.sites, block.attn, block.mlp
    qkv = all_gather_matmul(layer_norm(block.ln_1, x), *attn.qkv_weight(), group, site=sites["attn"])
    y = attn.attend(qkv, T, block.probs_dropout(), kv)
    a = matmul_reduce_scatter(y, attn.proj_weight(), group, site=sites["attn"])
    x = block.sp_close(x, a, attn.c_proj, "attn", masked=False)
    u = mlp.gelu(all_gather_matmul(layer_norm(block.ln_2, x), *mlp.fc_weight(), group, site=sites["mlp"]))
    m = matmul_reduce_scatter(u, mlp.proj_weight(), group, site=sites["mlp"])
    return block.sp_close(x, m, mlp.c_proj, "mlp", masked=False)
