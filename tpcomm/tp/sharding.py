"""
How GPT-layout tensors split into tensor-parallel shards: the plan as data, and one adapter that cuts a full
tensor into this rank's shard and gathers the shards back. Weights and optimizer moments go through the same
adapter, so checkpoints are always GPT's unsharded layout, whatever the layout of the run that wrote them.

Shard i of tp owns attention heads [i*H/tp, (i+1)*H/tp) (its rows of each of q, k, v in c_attn and the
matching input columns of attn.c_proj) and MLP hidden units [i*4C/tp, (i+1)*4C/tp) (rows of c_fc, columns of
mlp.c_proj). Everything else (embeddings, layer norms, lm_head, both c_proj biases) is replicated.
"""

import torch
import torch.distributed as dist

# parameter-name suffix -> (the full tensor viewed with a shard dimension of size tp, that view dimension, the
# dimension of the parameter that the shards split); C = n_embd
SHARDED = {
    "attn.c_attn.weight": (lambda C, tp: (3, tp, C // tp, C), 1, 0),  # [q | k | v] rows, each split by heads
    "attn.c_attn.bias": (lambda C, tp: (3, tp, C // tp), 1, 0),
    "attn.c_proj.weight": (lambda C, tp: (C, tp, C // tp), 1, 1),  # input columns, by heads
    "mlp.c_fc.weight": (lambda C, tp: (tp, 4 * C // tp, C), 0, 0),  # hidden-unit rows
    "mlp.c_fc.bias": (lambda C, tp: (tp, 4 * C // tp), 0, 0),
    "mlp.c_proj.weight": (lambda C, tp: (C, tp, 4 * C // tp), 1, 1),  # hidden-unit columns
}


def shard_rule(name):
    """The SHARDED entry for a parameter name, or None for a replicated parameter."""
    return next((rule for suffix, rule in SHARDED.items() if name.endswith(suffix)), None)


def is_block_replicated(name):
    """Replicated parameters inside the blocks (layer norms, c_proj biases): in real mode each rank's gradient
    of them is a partial one, summed over the tp group once per step."""
    return ".h." in name and shard_rule(name) is None


# rows split by vocabulary id with loss_parallel
VOCAB_PARALLEL = ("transformer.wte.weight", "lm_head.weight")


def padded_vocab(vocab_size, tp):
    """The vocabulary padded up to a multiple of tp, so every shard holds as many rows
    (Megatron pads likewise)."""
    return -(-vocab_size // tp) * tp


class TPSharding:
    """GPT-layout tensor <-> this rank's tensor. Simulated (every shard in one process) the two are the same,
    but for the vocabulary padding; in real mode a rank holds the slice of its tp rank. With vocab_parallel
    the tied wte/lm_head weight (V, C) is padded to (V', C) and split by rows: shard i holds ids [i*V'/tp,
    (i+1)*V'/tp); the padding rows are zeros and never reach a checkpoint."""

    def __init__(self, *, n_embd, tp, group, vocab_size=None, vocab_parallel=False):
        self.C, self.tp, self.group = n_embd, tp, group
        self.V = vocab_size
        self.vocab_parallel = vocab_parallel
        self.V_pad = padded_vocab(vocab_size, tp) if vocab_parallel else vocab_size

    def is_vocab(self, name):
        return self.vocab_parallel and name in VOCAB_PARALLEL

    def is_sharded(self, name):
        return shard_rule(name) is not None or self.is_vocab(name)

    def local_shape(self, name, full_shape):
        rule = shard_rule(name)
        if rule is None or not self.group.real:
            return tuple(full_shape)
        shape = list(full_shape)
        shape[rule[2]] //= self.tp
        return tuple(shape)

    def shard(self, name, full):
        """This rank's part of a GPT-layout tensor (the tensor itself when simulated or replicated)."""
        if self.is_vocab(name):
            padded = torch.cat([full, full.new_zeros(self.V_pad - self.V, *full.shape[1:])])
            if not self.group.real:
                return padded
            Vs = self.V_pad // self.tp
            return padded[self.group.first_shard * Vs:(self.group.first_shard + 1) * Vs]
        rule = shard_rule(name)
        if rule is None or not self.group.real:
            return full
        view, dim, _ = rule
        part = full.reshape(view(self.C, self.tp)).narrow(dim, self.group.first_shard, 1)
        return part.reshape(self.local_shape(name, full.shape))

    def gather(self, name, local):
        """The GPT-layout tensor assembled from every tp rank's part (a collective in real mode)."""
        if self.is_vocab(name):
            if self.group.real:
                parts = [torch.empty_like(local) for _ in range(self.tp)]
                dist.all_gather(parts, local.contiguous(), group=self.group.group)
                local = torch.cat(parts)
            return local[:self.V]
        rule = shard_rule(name)
        if rule is None or not self.group.real:
            return local
        view, dim, param_dim = rule
        local_view = list(view(self.C, self.tp))
        local_view[dim] = 1
        parts = [torch.empty_like(local) for _ in range(self.tp)]
        dist.all_gather(parts, local.contiguous(), group=self.group.group)
        full_shape = list(local.shape)
        full_shape[param_dim] *= self.tp
        return torch.cat([p.reshape(local_view) for p in parts], dim=dim).reshape(full_shape)

    def numel_of_full(self, name, local):
        """Elements of the whole (unsharded, unpadded) parameter that `local` is this rank's part of."""
        if self.is_vocab(name):
            return self.V * local.shape[1]
        return local.numel() * (self.tp if self.group.real and self.is_sharded(name) else 1)
