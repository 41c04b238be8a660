"""
Tensor-parallel communication: Megatron-LM's two operators as autograd functions, and the groups they run on.

    copy_to_tp_region     (f)  forward: identity, a replicated (N, C) value fans out to the shards (L, N, C)
                               backward: all-reduce (sum) of the shards' gradients
    reduce_from_tp_region (g)  forward: all-reduce (sum) of the shards' partial results (L, N, C) -> (N, C)
                               backward: identity

A group is SimulatedTP (one process holds all tp shards as the leading dimension L = tp of every shard-side
tensor; the all-reduce is a sum over that dimension) or RealTP (each rank holds its own shard, L = 1; the
all-reduce is torch.distributed.all_reduce over the tp process group). The block code is the same for both.
The operators count every collective they run (CommCounter), so communication is measured, not computed.
"""

import time

import torch
import torch.distributed as dist


class CommCounter:
    """Collectives counted by f and g: how many, and their payload (the tensor each rank contributes)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.fwd = self.bwd = self.grad_sync = 0
        self.fwd_bytes = self.bwd_bytes = 0
        self.vocab = self.vocab_bytes = 0  # the vocab-parallel embedding and loss, counted apart (loss_parallel)
        self.seconds = 0.0  # wall time inside real collectives (RealTP only), waiting for the other ranks included

    def add(self, direction, nbytes, *, vocab=False):
        if vocab:
            self.vocab, self.vocab_bytes = self.vocab + 1, self.vocab_bytes + nbytes
        elif direction == "fwd":
            self.fwd, self.fwd_bytes = self.fwd + 1, self.fwd_bytes + nbytes
        else:
            self.bwd, self.bwd_bytes = self.bwd + 1, self.bwd_bytes + nbytes

    def report(self, *, micro_steps, tokens):
        """Per forward/backward pass (one micro-batch of `tokens` tokens); gradient syncs per optimizer step. The
        residual-stream syncs (fwd/bwd_allreduces) never include the vocab-parallel collectives, reported apart."""
        n = max(1, micro_steps)
        out = dict(fwd_allreduces=self.fwd // n, bwd_allreduces=self.bwd // n, grad_sync_allreduces=self.grad_sync,
                   comm_bytes_per_token=(self.fwd_bytes + self.bwd_bytes) / (n * tokens), comm_seconds=self.seconds)
        if self.vocab:
            out.update(vocab_allreduces=self.vocab // n, vocab_bytes_per_token=self.vocab_bytes / (n * tokens))
        return out


class SimulatedTP:
    """All tp shards in this process: shard-side tensors are (L, N, C) with L = tp."""

    real = False

    def __init__(self, tp):
        self.tp, self.local, self.first_shard = tp, tp, 0
        self.counter = CommCounter()

    def sum_shards(self, x):
        """(L, ...) partial results -> (...) their sum over the tp shards."""
        return x.sum(0)

    def max_shards(self, x):
        """(L, ...) -> (...) the elementwise maximum over the tp shards."""
        return x.amax(0)

    def gather_shards(self, x):
        """(L, ..., K) -> (..., L*K): the shards' last dimensions side by side (shard order)."""
        return torch.cat(x.unbind(0), dim=-1)

    def synced(self, p):
        """A replicated parameter used on the synced stream (see RealTP.synced): nothing to do here."""
        return p

    def delta(self, r, xbar):
        """d_i = r_i - xbar (see _Delta): the sum over shards of d's gradient is a sum over the L local shards."""
        return _Delta.apply(r, xbar, 1.0)

    def fan_out(self, xbar, norm):
        """The synced stream on the shards, r_i = f(xbar), and norm(r_i). Every shard's value is the same, so the
        norm runs once on xbar; its gradient still reaches xbar once per shard (through the expand)."""
        r = copy_to_tp_region(xbar, self)
        return r, norm(xbar).unsqueeze(0).expand_as(r)

    def sync_replicated_grads(self, grads):
        """Each replicated parameter has one gradient here, already whole."""

    def sum_over_shards(self, sq):
        """A per-rank scalar summed over the tp ranks (the sharded part of a squared gradient norm)."""
        return sq


class RealTP:
    """One shard per rank of a tp process group: shard-side tensors are (1, N, C)."""

    real = True

    def __init__(self, tp, *, group, rank):
        self.tp, self.local, self.first_shard = tp, 1, rank
        self.group = group
        self.counter = CommCounter()

    def all_reduce(self, t, op=dist.ReduceOp.SUM):
        """Sum (or op) over the tp group (a fresh tensor), timed into the counter."""
        t = t.contiguous().clone()
        start = time.perf_counter()
        dist.all_reduce(t, op=op, group=self.group)
        self.counter.seconds += time.perf_counter() - start
        return t

    def sum_shards(self, x):
        return self.all_reduce(x).squeeze(0)

    def max_shards(self, x):
        return self.all_reduce(x, op=dist.ReduceOp.MAX).squeeze(0)

    def gather_shards(self, x):
        parts = [torch.empty_like(x) for _ in range(self.tp)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat([p.squeeze(0) for p in parts], dim=-1)

    def synced(self, p):
        """A replicated block parameter used on the synced stream. Real mode sums the gradients of block-replicated
        parameters over the tp group after backward; this use's gradient is equal on every rank, so it enters that
        sum as 1/tp of itself."""
        return _ScaleGrad.apply(p, 1.0 / self.tp)

    def delta(self, r, xbar):
        """d_i = r_i - xbar. Each rank holds one of tp equal gradient terms of xbar (g's backward gives every rank
        the same gradient), so the sum over shards is tp times the local one."""
        return _Delta.apply(r, xbar, float(self.tp))

    def fan_out(self, xbar, norm):
        r = copy_to_tp_region(xbar, self)
        return r, norm(r)

    def sync_replicated_grads(self, grads):
        """Sum the given gradients over the tp group in one all-reduce (in place); counted as a gradient sync."""
        if not grads:
            return
        flat = self.all_reduce(torch.cat([g.reshape(-1) for g in grads]))
        self.counter.grad_sync += 1
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def sum_over_shards(self, sq):
        return self.all_reduce(sq.view(1)).view(())


def tp_group(tp, pd=None):
    """RealTP when the process grid has a tp dimension of more than one rank, else SimulatedTP."""
    if pd is not None and pd.tp > 1:
        return RealTP(tp, group=pd.tp_group, rank=pd.tp_rank)
    return SimulatedTP(tp)


def _in_autocast_dtype(x):
    """Under autocast f's output only feeds matmuls and g's input comes from them: both move in the autocast
    dtype, so the collectives carry bf16 both ways, as Megatron's do (forward values do not change)."""
    if torch.is_autocast_enabled(x.device.type):
        return x.to(torch.get_autocast_dtype(x.device.type))
    return x


def _count(group, direction, t, vocab=False):
    if group.tp > 1:  # a collective over one rank moves nothing (Megatron skips it)
        group.counter.add(direction, t.numel() // group.local * t.element_size(), vocab=vocab)


class _CopyToTPRegion(torch.autograd.Function):
    """f: identity forward (fan-out), all-reduce backward."""

    @staticmethod
    def forward(ctx, x, group, vocab):
        ctx.group, ctx.vocab = group, vocab
        return x.unsqueeze(0).expand(group.local, *x.shape)

    @staticmethod
    def backward(ctx, grad):
        _count(ctx.group, "bwd", grad, ctx.vocab)
        return ctx.group.sum_shards(grad), None, None


class _ReduceFromTPRegion(torch.autograd.Function):
    """g: all-reduce forward, identity backward (the gradient fans out to the shards)."""

    @staticmethod
    def forward(ctx, x, group, vocab):
        ctx.group = group
        _count(group, "fwd", x, vocab)
        return group.sum_shards(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.unsqueeze(0).expand(ctx.group.local, *grad.shape), None, None


def copy_to_tp_region(x, group, *, vocab=False):
    """f: (N, C) replicated -> (L, N, C) on the shards; backward all-reduces the shards' gradients.
    vocab=True counts it with the vocab-parallel collectives instead of the residual-stream syncs."""
    return _CopyToTPRegion.apply(_in_autocast_dtype(x), group, vocab)


def reduce_from_tp_region(x, group, *, vocab=False):
    """g: (L, N, C) partial results -> (N, C), their sum over all tp shards; backward identity."""
    return _ReduceFromTPRegion.apply(_in_autocast_dtype(x), group, vocab)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy from logits sharded over the vocabulary, without gathering them (Megatron-LM's
    vocab-parallel cross-entropy): three per-token all-reduces (max, sum of exp, target logit). Backward is local:
    softmax - one-hot on each shard's columns."""

    @staticmethod
    def forward(ctx, logits, targets, group, vocab_start, ignore_index):
        # logits (L, N, Vs) float32; vocab_start (L, 1) first vocabulary id of each local shard; targets (N,)
        m = group.max_shards(logits.amax(-1))  # (N,) the max over the whole vocabulary
        e = torch.exp(logits - m.unsqueeze(-1))
        s = group.sum_shards(e.sum(-1))  # (N,)
        local = targets.unsqueeze(0) - vocab_start  # (L, N) target's column on each shard
        mine = (local >= 0) & (local < logits.size(-1))
        t = logits.gather(-1, local.clamp(0, logits.size(-1) - 1).unsqueeze(-1)).squeeze(-1)
        t = group.sum_shards(torch.where(mine, t, torch.zeros_like(t)))  # (N,) the target's logit
        for x in (m, s, t):
            _count(group, "fwd", x.unsqueeze(0).expand(group.local, *x.shape), vocab=True)
        valid = targets != ignore_index
        n = valid.sum().clamp(min=1)
        loss = ((s.log() + m - t) * valid).sum() / n.to(logits.dtype)
        ctx.save_for_backward(e, s, local, mine, valid, n)
        return loss

    @staticmethod
    def backward(ctx, grad):
        e, s, local, mine, valid, n = ctx.saved_tensors
        g = e / s.unsqueeze(-1)  # softmax on this shard's columns
        g.scatter_add_(-1, local.clamp(0, g.size(-1) - 1).unsqueeze(-1), -mine.unsqueeze(-1).to(g.dtype))
        return g * (valid.to(g.dtype) * (grad / n)).unsqueeze(-1), None, None, None, None


def vocab_parallel_cross_entropy(logits, targets, group, vocab_start, *, ignore_index=-1):
    """Mean cross-entropy over the tokens whose target is not ignore_index; logits (L, N, Vs) of the local
    vocabulary shards, with padded columns set to -inf."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # fp32 at least (bf16 logits), fp64 kept
    return _VocabParallelCrossEntropy.apply(logits, targets, group, vocab_start, ignore_index)


f, g = copy_to_tp_region, reduce_from_tp_region  # the names the literature uses


def _is_one_tensor_for_all_shards(grad):
    """True for the gradient g's backward produces: one (N, C) tensor expanded over the shards (stride 0)."""
    return grad.dim() > 0 and grad.stride(0) == 0


class _Delta(torch.autograd.Function):
    """d_i = r_i - xbar, (L, N, C), (N, C) -> (L, N, C): a fresh tensor (not a view) that a shard projection may
    accumulate into in place. Backward: xbar's gradient is minus the sum of d's gradient over all tp shards,
    `scale` times the sum over the local ones."""

    @staticmethod
    def forward(ctx, r, xbar, scale):
        ctx.scale = scale
        return r - xbar

    @staticmethod
    def backward(ctx, grad):
        if _is_one_tensor_for_all_shards(grad):
            total = grad[0] * (grad.shape[0] * ctx.scale)
        else:
            total = grad.sum(0) * ctx.scale if ctx.scale != 1.0 else grad.sum(0)
        return grad, total.neg_(), None


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p, scale):
        ctx.scale = scale
        return p.view_as(p)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None
