"""
The vocabulary-parallel loss (loss_parallel; Megatron-LM's vocab-parallel cross-entropy): the loss from logits
sharded over the vocabulary, without gathering them. DistributedGPT.vocab_parallel_head computes the sharded
logits and calls it.
"""

import torch

from tpcomm.tp.counting import VOCAB_LOSS, count_collective, traced


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy from logits sharded over the vocabulary, without gathering them (Megatron-LM's
    vocab-parallel cross-entropy): three per-token all-reduces (max, sum of exp, target logit). Backward is
    local: softmax - one-hot on each shard's columns."""

    @staticmethod
    def forward(ctx, logits, targets, group, vocab_start, ignore_index):
        # logits (L, N, Vs) float32; vocab_start (L, 1) first vocabulary id of each local shard; targets (N,)
        def reduce(reduce_shards, op, x):  # (L, N) -> (N,) over the tp shards, counted and traced
            with traced(group, op, "fwd", VOCAB_LOSS, count_collective(group, "fwd", x, vocab=True)):
                return reduce_shards(x)

        m = reduce(group.max_shards, "max", logits.amax(-1))  # (N,) the max over the whole vocabulary
        e = torch.exp(logits - m.unsqueeze(-1))
        s = reduce(group.sum_shards, "sum", e.sum(-1))  # (N,)
        local = targets.unsqueeze(0) - vocab_start  # (L, N) target's column on each shard
        mine = (local >= 0) & (local < logits.size(-1))
        t = logits.gather(-1, local.clamp(0, logits.size(-1) - 1).unsqueeze(-1)).squeeze(-1)
        # (N,) the target's logit
        t = reduce(group.sum_shards, "sum", torch.where(mine, t, torch.zeros_like(t)))
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
    # fp32 at least (bf16 logits), fp64 kept
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return _VocabParallelCrossEntropy.apply(logits, targets, group, vocab_start, ignore_index)


