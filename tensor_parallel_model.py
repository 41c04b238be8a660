"""
DistributedGPT: GPT-2 whose blocks are Megatron tensor-parallel ('tp', 2 forward all-reduces),
Sync-Point Drop ('spd', arXiv 2502.20727, 1 all-reduce) or fully 'parallel' (0), chosen per layer.

Shard i of tp owns attention heads [i*H/tp, (i+1)*H/tp) (its slice of each of q, k, v and the matching
input columns of attn.c_proj) and MLP hidden units [i*4C/tp, (i+1)*4C/tp). Everything else is replicated.
Tensors on the shard side carry a leading shard dimension L: L = tp when simulated (one process holds every
shard), L = 1 in real mode (each rank holds its own shard). Inside the blocks the stream is flat over tokens:
synced (N, C), per shard (L, N, C), N = B*T, so no view sits between a tensor and its uses (autograd can then
accumulate a stream's two gradients in place). Parameters keep GPT's names and, simulated,
GPT's exact shapes (L = tp), so a GPT state dict loads as it is; in real mode each rank holds the L = 1 slice.
All communication goes through f (fan-out; backward all-reduce) and g (forward all-reduce), Megatron-LM's
copy_to / reduce_from operators, which also count every collective they run.
"""

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn import functional as F

from configurator import ConfigError
from model import GPT, GPTConfig, LayerNorm, configure_adamw, estimate_mfu, lm_head_and_loss

BLOCK_TYPES = ("tp", "spd", "parallel")


def validate_tp_args(*, n_layer, n_head, n_embd, tp_size, block_types):
    """Raise ConfigError naming the key and values for any impossible combination."""
    if not isinstance(tp_size, int) or tp_size < 1:
        raise ConfigError(f"tp_size must be a positive int, got {tp_size!r}")
    if n_head % tp_size:
        raise ConfigError(f"n_head ({n_head}) must be divisible by tp_size ({tp_size})")
    if n_embd % n_head:
        raise ConfigError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
    if block_types is None:
        return
    if isinstance(block_types, str):  # one type for every layer: 'spd' means ['spd'] * n_layer
        if block_types not in BLOCK_TYPES:
            raise ConfigError(f"block_types: unknown block type {block_types!r}; use {list(BLOCK_TYPES)}")
        return
    if not isinstance(block_types, (list, tuple)):
        raise ConfigError(f"block_types must be a list of {BLOCK_TYPES}, got {block_types!r}")
    if len(block_types) != n_layer:
        raise ConfigError(f"block_types has {len(block_types)} entries but n_layer is {n_layer}")
    bad = sorted({str(b) for b in block_types if b not in BLOCK_TYPES})
    if bad:
        raise ConfigError(f"block_types: unknown block type(s) {bad}; use {list(BLOCK_TYPES)}")


@dataclass
class TPConfig(GPTConfig):
    tp_size: int = 1
    block_types: Optional[list] = None  # one of BLOCK_TYPES per layer, or one for all layers; None = all 'tp'

    def __post_init__(self):
        validate_tp_args(n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd, tp_size=self.tp_size,
                         block_types=self.block_types)
        kinds = "tp" if self.block_types is None else self.block_types
        self.block_types = [kinds] * self.n_layer if isinstance(kinds, str) else list(kinds)


class CommCounter:
    """Counts the collectives f and g run (their payload: the per-rank tensor each one all-reduces)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.fwd = self.bwd = self.grad_sync = 0
        self.fwd_bytes = self.bwd_bytes = self.grad_sync_bytes = 0
        self.seconds = 0.0  # wall time inside real collectives (real mode only)

    def report(self, *, micro_steps, tokens):
        """Per forward/backward pass (one micro-batch of `tokens` tokens); gradient syncs per optimizer step."""
        n = max(1, micro_steps)
        return dict(fwd_allreduces=self.fwd // n, bwd_allreduces=self.bwd // n,
                    grad_sync_allreduces=self.grad_sync,
                    comm_bytes_per_token=(self.fwd_bytes + self.bwd_bytes) / (n * tokens),
                    comm_seconds=self.seconds)


class TPComm:
    """The tensor-parallel 'group': tp shards, L of them local (L = tp simulated, 1 real)."""

    def __init__(self, tp, *, group=None):
        self.tp, self.group = tp, group
        self.real = group is not None and tp > 1
        self.local = 1 if self.real else tp
        self.counter = CommCounter()

    def count(self, direction, t):
        if self.tp == 1:
            return  # a collective over one rank moves nothing (Megatron skips it)
        per_rank = t.numel() // self.local * t.element_size()
        if direction == "fwd":
            self.counter.fwd += 1
            self.counter.fwd_bytes += per_rank
        else:
            self.counter.bwd += 1
            self.counter.bwd_bytes += per_rank

    def all_reduce(self, t):
        """Sum of a (1, ...) local shard tensor over the tp group (real mode), timed."""
        import time

        t = t.contiguous().clone()
        start = time.perf_counter()
        dist.all_reduce(t, group=self.group)
        self.counter.seconds += time.perf_counter() - start
        return t

    def f(self, x):
        """(N, C) replicated -> (L, N, C) on the shards; backward all-reduces the shards' gradients."""
        return _F.apply(self.autocast(x), self)

    def g(self, x):
        """(L, N, C) partial results -> (N, C) their sum over all tp shards; backward identity."""
        return _G.apply(self.autocast(x), self)

    @staticmethod
    def autocast(x):
        """Under autocast, f's output only feeds matmuls and g's input comes from them: both in the autocast
        dtype, so the collectives move bf16 both ways, as Megatron's do (the forward values do not change)."""
        if torch.is_autocast_enabled(x.device.type):
            return x.to(torch.get_autocast_dtype(x.device.type))
        return x

    def synced(self, p):
        """A replicated block parameter used on the synced stream. Real mode sums block-parameter gradients over
        the tp group after backward; this use's gradient is equal on every rank, so it enters that sum as 1/tp."""
        return _ScaleGrad.apply(p, 1.0 / self.tp) if self.real else p

    def delta(self, r, xbar):
        """d_i = r_i - xbar, each shard's part of the stream that a sync adds to xbar: (L, N, C), (N, C) ->
        (L, N, C), a fresh tensor (not a view) that a shard projection may accumulate into in place. Backward:
        xbar's gradient is minus the sum of d's over the shards. Simulated, that sum is over the L local shards
        (L times one of them when the gradient is g's backward broadcast); in real mode each rank holds one of tp
        equal terms (g's backward gives every rank the same gradient), so it is scaled by tp instead."""
        return _Delta.apply(r, xbar, float(self.tp) if self.real else 1.0)


class _Delta(torch.autograd.Function):
    @staticmethod
    def forward(ctx, r, xbar, scale):
        ctx.scale = scale
        return r - xbar

    @staticmethod
    def backward(ctx, grad):
        if grad.stride(0) == 0:  # g's backward broadcast: every shard's gradient is one tensor
            total = grad[0] * (grad.shape[0] * ctx.scale)
        else:
            total = grad.sum(0) * ctx.scale if ctx.scale != 1.0 else grad.sum(0)
        return grad, total.neg_(), None


class _F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.unsqueeze(0).expand(comm.local, *x.shape)

    @staticmethod
    def backward(ctx, grad):
        comm = ctx.comm
        comm.count("bwd", grad)
        if comm.real:
            return comm.all_reduce(grad).squeeze(0), None
        return grad.sum(0), None


class _G(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        comm.count("fwd", x)
        if comm.real:
            return comm.all_reduce(x).squeeze(0)
        return x.sum(0)

    @staticmethod
    def backward(ctx, grad):
        return grad.unsqueeze(0).expand(ctx.comm.local, *grad.shape), None


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p, scale):
        ctx.scale = scale
        return p.view_as(p)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


def layer_norm(ln, x):
    return F.layer_norm(x, ln.weight.shape, ln.weight, ln.bias, 1e-5)


def synced_layer_norm(ln, x, comm):
    bias = comm.synced(ln.bias) if ln.bias is not None else None
    return F.layer_norm(x, ln.weight.shape, comm.synced(ln.weight), bias, 1e-5)


def project(y, w, acc, dropout, own_acc=False):
    """acc + dropout(y @ w) batched over shards (acc None: no add), all (L, N, .). Without dropout or autocast
    the add is fused into the matmul, in place when acc is a temporary nothing else uses (own_acc); under
    autocast it is not fused, so a float32 residual stream stays float32."""
    if acc is None:
        return dropout(torch.bmm(y, w))
    if (dropout.p and dropout.training) or torch.is_autocast_enabled(y.device.type):
        return acc + dropout(torch.bmm(y, w))
    return acc.baddbmm_(y, w) if own_acc else torch.baddbmm(acc, y, w)


class ShardedAttention(nn.Module):
    """Attention of L shards at once: acc + each shard's c_proj partial, without the bias b_A."""

    def __init__(self, config, local):
        super().__init__()
        C, tp = config.n_embd, config.tp_size
        self.L, self.Cs, self.nh = local, C // tp, config.n_head // tp  # shards, width and heads per shard
        self.c_attn = nn.Linear(C, 3 * local * self.Cs, bias=config.bias)  # rows: [q | k | v], each (L, Cs)
        self.c_proj = nn.Linear(local * self.Cs, C, bias=config.bias)  # columns sharded, bias b_A replicated
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, h, T, acc=None, own_acc=False):  # h, acc: (L, N, C), N = B*T tokens
        L, N, C = h.shape
        B, Cs, nh = N // T, self.Cs, self.nh
        w = self.c_attn.weight.view(3, L, Cs, C).transpose(0, 1).reshape(L, 3 * Cs, C)  # shard i: its q, k, v
        if self.c_attn.bias is not None:
            b = self.c_attn.bias.view(3, L, 1, Cs).transpose(0, 1).reshape(L, 1, 3 * Cs)
            qkv = torch.baddbmm(b, h, w.transpose(1, 2))  # (L, N, 3Cs)
        else:
            qkv = torch.bmm(h, w.transpose(1, 2))
        # shards x batch as one batch dim, 4-D as GPT does, so SDPA can take its fused kernel
        q, k, v = qkv.view(L * B, T, 3, nh, Cs // nh).permute(2, 0, 3, 1, 4).unbind(0)  # (L*B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True)
        y = y.transpose(1, 2).reshape(L, N, Cs)  # each shard's heads side by side
        wp = self.c_proj.weight.view(C, L, Cs).permute(1, 2, 0)  # (L, Cs, C): shard i's input rows
        return project(y, wp, acc, self.resid_dropout, own_acc)


class ShardedMLP(nn.Module):
    """MLP of L shards at once: acc + each shard's c_proj partial, without the bias b_M."""

    def __init__(self, config, local):
        super().__init__()
        C, tp = config.n_embd, config.tp_size
        self.L, self.Hs = local, 4 * C // tp  # hidden units per shard
        self.c_fc = nn.Linear(C, local * self.Hs, bias=config.bias)
        self.c_proj = nn.Linear(local * self.Hs, C, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, h, acc=None, own_acc=False):  # h, acc: (L, N, C)
        L, N, C = h.shape
        w = self.c_fc.weight.view(L, self.Hs, C).transpose(1, 2)  # (L, C, Hs)
        if self.c_fc.bias is not None:
            u = torch.baddbmm(self.c_fc.bias.view(L, 1, self.Hs), h, w)
        else:
            u = torch.bmm(h, w)
        wp = self.c_proj.weight.view(C, L, self.Hs).permute(1, 2, 0)  # (L, Hs, C)
        return project(F.gelu(u), wp, acc, self.dropout, own_acc)


class TPBlock(nn.Module):
    """One block of any type. The residual stream enters and leaves as (xbar, r): xbar (N, C) the last synced
    value; r (L, N, C) each shard's stream r_i = xbar + d_i when desynced, else None. d_i = r_i - xbar is
    formed only where a sync needs it."""

    def __init__(self, config, kind, comm):
        super().__init__()
        self.kind, self.comm = kind, comm
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = ShardedAttention(config, comm.local)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = ShardedMLP(config, comm.local)

    def add_bias(self, x, linear, *, synced, scale=1.0):
        b = linear.bias
        if b is None:
            return x
        return x + (self.comm.synced(b) if synced else b) * scale

    def fan_out(self, xbar):
        """The synced stream on the shards, r_i = xbar, and LN1(r_i). Simulated, LN1 runs once on xbar (every
        shard's value is the same); in real mode each rank runs it on its copy. Either way the gradient reaches
        xbar through the one f, so the backward pass all-reduces once."""
        r = self.comm.f(xbar)
        if self.comm.real:
            return r, layer_norm(self.ln_1, r)
        h = layer_norm(self.ln_1, xbar)
        return r, h.unsqueeze(0).expand_as(r)

    def forward(self, xbar, r, T):  # T: tokens per sequence (attention is causal within each)
        comm = self.comm
        if self.kind == "tp":
            # x' = xbar + sum_i [d_i + A_i(LN1(r_i))] + b_A;  x'' = x' + sum_i M_i(LN2(x')) + b_M
            if r is None:
                a = self.attn(comm.f(synced_layer_norm(self.ln_1, xbar, comm)), T)
            else:
                a = self.attn(layer_norm(self.ln_1, r), T, acc=comm.delta(r, xbar), own_acc=True)
            x = self.add_bias(xbar + comm.g(a), self.attn.c_proj, synced=True)
            m = self.mlp(comm.f(synced_layer_norm(self.ln_2, x, comm)))
            return self.add_bias(x + comm.g(m), self.mlp.c_proj, synced=True), None
        if r is None:
            r, h = self.fan_out(xbar)
        else:
            h = layer_norm(self.ln_1, r)
        if self.kind == "spd":
            # y_i = r_i + A_i(LN1(r_i)) + b_A stays local; x' = xbar + sum_i [d_i + A_i + M_i(LN2(y_i))] + b_A + b_M
            y = self.add_bias(self.attn(h, T, acc=r), self.attn.c_proj, synced=False)
            acc = self.add_bias(comm.delta(y, xbar), self.attn.c_proj, synced=False, scale=-1.0)
            s = self.mlp(layer_norm(self.ln_2, y), acc=acc, own_acc=True)
            x = self.add_bias(xbar + comm.g(s), self.attn.c_proj, synced=True)
            return self.add_bias(x, self.mlp.c_proj, synced=True), None
        # parallel: r_i += A_i(LN1(r_i)) + b_A/tp; r_i += M_i(LN2(r_i)) + b_M/tp; nothing is communicated
        r = self.add_bias(self.attn(h, T, acc=r), self.attn.c_proj, synced=False, scale=1 / comm.tp)
        r = self.add_bias(self.mlp(layer_norm(self.ln_2, r), acc=r), self.mlp.c_proj, synced=False,
                          scale=1 / comm.tp)
        return xbar, r


# How each sharded parameter's GPT-layout tensor splits into shards: (view of the full tensor, shard dim).
def _shard_views(name, C, tp, L):
    Cs, Hs = C // tp, 4 * C // tp
    if name.endswith("attn.c_attn.weight"):
        return (3, L, Cs, C), 1
    if name.endswith("attn.c_attn.bias"):
        return (3, L, Cs), 1
    if name.endswith("attn.c_proj.weight"):
        return (C, L, Cs), 1
    if name.endswith("mlp.c_fc.weight"):
        return (L, Hs, C), 0
    if name.endswith("mlp.c_fc.bias"):
        return (L, Hs), 0
    if name.endswith("mlp.c_proj.weight"):
        return (C, L, Hs), 1
    return None


def is_block_replicated(name):
    """Replicated parameters inside blocks: their gradients are summed over the tp group in real mode."""
    return ".h." in name and (".ln_" in name or name.endswith("c_proj.bias"))


class DistributedGPT(GPT):
    """GPT with tensor-parallel blocks. `pd` (parallel.ParallelDims) with pd.tp > 1 selects real mode."""

    def __init__(self, config, *, pd=None):
        nn.Module.__init__(self)
        assert isinstance(config, TPConfig)
        self.config = config
        real = pd is not None and pd.tp > 1
        if real and pd.tp != config.tp_size:
            raise ConfigError(f"tp_mode='real' runs {pd.tp} tp ranks but tp_size is {config.tp_size}")
        self.comm = TPComm(config.tp_size, group=pd.tp_group if real else None)
        rng = torch.get_rng_state()  # the modules' default init is overwritten below; GPT's init draws from here
        self.tp_rank = pd.tp_rank if real else 0
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([TPBlock(config, kind, self.comm) for kind in config.block_types]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        # GPT-2 init on the full matrices (GPT's own init, same random stream), then sharded
        gpt_config = GPTConfig(**{k: getattr(config, k) for k in GPTConfig.__dataclass_fields__})
        torch.set_rng_state(rng)
        full = GPT(gpt_config).state_dict()
        self._full_shapes = {k: v.shape for k, v in full.items()}
        self._local_shapes = {k: v.shape for k, v in self.state_dict().items()}
        self.load_gpt_state_dict(full)

    @classmethod
    def from_gpt(cls, gpt, tp_size, block_types=None, *, pd=None):
        config = TPConfig(**{k: getattr(gpt.config, k) for k in GPTConfig.__dataclass_fields__},
                          tp_size=tp_size, block_types=block_types)
        model = cls(config, pd=pd)
        model.load_gpt_state_dict(gpt.state_dict())
        return model

    def to_gpt(self):
        gpt = GPT(GPTConfig(**{k: getattr(self.config, k) for k in GPTConfig.__dataclass_fields__}))
        gpt.load_state_dict(self.gpt_state_dict())
        return gpt

    def forward(self, idx, targets=None):
        b, t = idx.size()
        if t > self.config.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size {self.config.block_size}")
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (b, t, C)
        xbar, r = x.view(b * t, -1), None  # the blocks' stream is flat over tokens
        for block in self.transformer.h:
            xbar, r = block(xbar, r, t)
        if r is not None:  # the last block left the stream desynced: one more sync
            xbar = xbar + self.comm.g(self.comm.delta(r, xbar))
        return lm_head_and_loss(self.lm_head, self.transformer.ln_f(xbar.view(b, t, -1)), targets)

    # --- GPT-layout state (checkpoints are always unsharded) ---

    def _local_slice(self, name, full):
        """This rank's part of a GPT-layout tensor (the tensor itself when simulated or replicated)."""
        spec = _shard_views(name, self.config.n_embd, self.config.tp_size, self.config.tp_size)
        if spec is None or not self.comm.real:
            return full
        shape, dim = spec
        return full.reshape(shape).narrow(dim, self.tp_rank, 1).reshape(self._local_shapes[name])

    def _gather(self, name, local):
        """The GPT-layout tensor assembled from every tp rank's part (a collective in real mode)."""
        spec = _shard_views(name, self.config.n_embd, self.config.tp_size, 1)
        if spec is None or not self.comm.real:
            return local
        shape, dim = spec
        parts = [torch.empty_like(local) for _ in range(self.config.tp_size)]
        dist.all_gather(parts, local.contiguous(), group=self.comm.group)
        return torch.cat([p.reshape(shape) for p in parts], dim=dim).reshape(self._full_shapes[name])

    def gpt_state_dict(self):
        """GPT's state dict (unsharded; in real mode gathered from the tp group, a collective)."""
        return {k: self._gather(k, v) for k, v in self.state_dict().items()}

    def load_gpt_state_dict(self, gpt_state_dict):
        own = self.state_dict()
        sd = {k: self._local_slice(k, v) for k, v in gpt_state_dict.items() if k in own}
        missing = set(own) - set(sd)
        if missing:
            raise KeyError(f"GPT state dict lacks {sorted(missing)[:3]}")
        self.load_state_dict(sd)

    def _param_names(self, optimizer):
        names = {id(p): n for n, p in self.named_parameters()}
        return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]

    def gpt_optimizer_state(self, optimizer):
        """The optimizer state dict in GPT's layout (same indices, unsharded moments)."""
        sd = optimizer.state_dict()
        if not self.comm.real:
            return sd
        names = self._param_names(optimizer)
        state = {i: {k: (self._gather(names[i], v) if v.dim() > 0 else v) for k, v in s.items()}
                 for i, s in sd["state"].items()}
        return {"state": state, "param_groups": sd["param_groups"]}

    def load_gpt_optimizer_state(self, optimizer, state_dict):
        if self.comm.real:
            names = self._param_names(optimizer)
            state = {i: {k: (self._local_slice(names[i], v) if v.dim() > 0 else v) for k, v in s.items()}
                     for i, s in state_dict["state"].items()}
            state_dict = {"state": state, "param_groups": state_dict["param_groups"]}
        optimizer.load_state_dict(state_dict)

    # --- training-step hooks used by train.py and bench.py ---

    def sync_replicated_grads(self):
        """Real mode: sum block-replicated parameters' gradients over the tp group, one all-reduce per step."""
        if not self.comm.real:
            return
        grads = [p.grad for n, p in self.named_parameters() if is_block_replicated(n) and p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        flat = self.comm.all_reduce(flat)
        self.comm.counter.grad_sync += 1
        self.comm.counter.grad_sync_bytes += flat.numel() * flat.element_size()
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm):
        """Clip by the norm of the whole (unsharded) model's gradient."""
        if not self.comm.real:
            return torch.nn.utils.clip_grad_norm_(self.parameters(), max_norm)
        sharded, replicated = [], []
        for n, p in self.named_parameters():
            if p.grad is not None:
                (sharded if _shard_views(n, 1, 1, 1) is not None else replicated).append(p.grad)
        acc = torch.promote_types(sharded[0].dtype, torch.float32)  # fp32 at least, float64 kept (as torch's)
        sq = torch.stack([g.to(acc).pow(2).sum() for g in sharded]).sum().view(1)
        sq = self.comm.all_reduce(sq).view(())
        if replicated:
            sq = sq + torch.stack([g.to(acc).pow(2).sum() for g in replicated]).sum()
        total = sq.sqrt()
        coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for n, p in self.named_parameters():
            if p.grad is not None:
                p.grad.mul_(coef.to(p.grad.dtype))
        return total

    def get_num_params(self, non_embedding=True):
        """Parameter count of the whole (unsharded) model, whatever this rank holds."""
        n = 0
        for name, p in self.named_parameters():
            sharded = self.comm.real and _shard_views(name, 1, 1, 1) is not None
            n += p.numel() * (self.config.tp_size if sharded else 1)
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
        return n

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return configure_adamw(self, weight_decay, learning_rate, betas, device_type)

    def estimate_mfu(self, fwdbwd_per_iter, dt, *, device=None):
        n_devices = self.config.tp_size if self.comm.real else 1
        return estimate_mfu(self, fwdbwd_per_iter, dt, device=device, n_devices=n_devices)

    def comm_per_forward(self, idx):
        """Measured collectives of one forward+backward pass on `idx` (a dict, see CommCounter.report)."""
        self.comm.counter.reset()
        _, loss = self(idx, idx)
        loss.backward()
        self.zero_grad(set_to_none=True)
        report = self.comm.counter.report(micro_steps=1, tokens=idx.numel())
        self.comm.counter.reset()
        return report
