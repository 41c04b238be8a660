"""
The single-device reference GPT (GPT-2 architecture), after nanoGPT.
Holds no parallelism: every parallel path in this repo is tested against it.

It also defines the interface the scripts use for either model (GPT here, DistributedGPT in
tensor_parallel_model.py): GPT-layout state and optimizer state, gradient clipping, replicated-gradient sync,
communication report, MFU, keyed dropout. GPT's versions are the plain ones (or no-ops), so no script has to
ask which model it holds.
"""

import hashlib
import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for efficiency
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # True: biases in Linears and LayerNorms, like GPT-2
    # GELU form: 'none' is the exact erf GELU (nanoGPT's); 'tanh' is the approximation GPT-2 was trained with
    # (Hugging Face's 'gelu_new'). from_pretrained sets 'tanh'. Same values as torch's F.gelu(approximate=...).
    gelu_approximate: str = "none"


GELU_FORMS = ("none", "tanh")
# GPTConfig fields that nanoGPT's own GPTConfig has: a checkpoint's model_args holds exactly these, so nanoGPT's
# scripts read checkpoints written here and the other way round.
NANOGPT_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")


def whole(t):
    """A DTensor (e.g. an FSDP-sharded parameter or moment) gathered whole, a collective; a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def local(t):
    """This rank's local shard of a DTensor; a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def laid_out_like(full, ref):
    """full distributed as ref is (FSDP: each rank keeps its data-parallel shard); full itself when ref is plain."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(ref, DTensor):
        return distribute_tensor(full.to(ref.device), ref.device_mesh, ref.placements)
    return full


class DropoutRNG:
    """Where the dropout masks come from. Unkeyed (the default), torch's global RNG, as in nanoGPT. Keyed
    (train.py calls model.seed_dropout(seed, iteration, micro_batch) before each micro-batch), every mask comes
    from a generator seeded by that key, the layer (-1: the embedding) and a stream number, so a resumed run, a run
    split over data-parallel ranks and one split into pipeline stages draw exactly the masks of one uninterrupted
    process. Stream 0 is the model replica's (masks on values every tensor-parallel shard shares); DistributedGPT
    gives each tp shard a stream of its own (Megatron's separate tensor-parallel RNG), so real and simulated tensor
    parallelism draw the same masks."""

    def __init__(self):
        self.key = None
        self._generators = {}

    def set_key(self, key):
        self.key = None if key is None else tuple(int(k) for k in key)
        self._generators.clear()

    def for_layer(self, layer):
        """The view of this RNG that one layer draws from (it follows set_key on the model's RNG)."""
        return _LayerRNG(self, layer)

    def generator(self, stream, device, layer=-1):
        """The generator of (layer, stream) for the current key (None when unkeyed): successive draws continue it."""
        if self.key is None:
            return None
        g = self._generators.get((layer, stream))
        if g is None:
            digest = hashlib.blake2b(repr((*self.key, layer, stream)).encode(), digest_size=8).digest()
            g = torch.Generator(device=device).manual_seed(int.from_bytes(digest, "little") >> 1)
            self._generators[layer, stream] = g
        return g


class _LayerRNG:
    def __init__(self, rng, layer):
        self.rng, self.layer = rng, layer

    @property
    def key(self):
        return self.rng.key

    def generator(self, stream, device):
        return self.rng.generator(stream, device, self.layer)


def keep_mask(shape, p, generators, device):
    """A dropout keep-mask scaled by 1/(1-p), drawn in float32 (so masks do not depend on the autocast dtype).
    With several generators (one per tp shard) the first dimension is split evenly between them, in order."""
    part = (shape[0] // len(generators), *shape[1:])
    masks = [torch.empty(part, device=device, dtype=torch.float32).bernoulli_(1.0 - p, generator=g) for g in generators]
    return (masks[0] if len(masks) == 1 else torch.cat(masks)).div_(1.0 - p)


def dropout(x, p, *, training, generators=None):
    """F.dropout, or with keyed generators (see DropoutRNG) the same thing with a mask drawn from them."""
    if not training or p == 0.0:
        return x
    if generators is None:
        return F.dropout(x, p, training=True)
    return x * keep_mask(x.shape, p, generators, x.device).to(x.dtype)


def causal_attention(q, k, v, *, p, training, generators=None):
    """Causal SDPA of (B, nh, Tq, hs) queries on (B, nh, Tk, hs) keys/values, with attention-probability dropout p.
    Tk > Tq when a KV cache holds earlier tokens: the queries are the last Tq positions. With keyed generators the
    probabilities are computed explicitly (SDPA draws its dropout mask from the global RNG only)."""
    Tq, Tk = q.size(-2), k.size(-2)
    if Tk > Tq:  # cached generation (eval): query i sits at position Tk - Tq + i
        mask = None if Tq == 1 else torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if not training or p == 0.0 or generators is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p if training else 0.0, is_causal=True)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    causal = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril()
    att = F.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
    att = att * keep_mask(att.shape, p, generators, att.device).to(att.dtype)
    return att @ v


class KVCache:
    """Keys and values of the tokens seen so far, one entry per layer, so that generation feeds only the new
    tokens. Each layer stores them in its own attention layout (DistributedGPT: each shard's own heads), for up to
    `size` positions (the model's block_size: absolute position embeddings cannot slide)."""

    def __init__(self, n_layer, size):
        self.pos, self.size = 0, size  # tokens already in the cache
        self.layers = [LayerKV(self) for _ in range(n_layer)]

    def advance(self, t):
        self.pos += t


class LayerKV:
    def __init__(self, cache):
        self.cache, self.k, self.v = cache, None, None

    def update(self, k, v):
        """Store the new tokens' (B', nh, t, hs) keys and values; return those of every token so far."""
        p, t = self.cache.pos, k.size(2)
        if self.k is None:
            self.k = k.new_empty(*k.shape[:2], self.cache.size, k.size(3))
            self.v = v.new_empty(*v.shape[:2], self.cache.size, v.size(3))
        self.k[:, :, p:p + t] = k
        self.v[:, :, p:p + t] = v
        return self.k[:, :, :p + t], self.v[:, :, :p + t]


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim, *, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config, rng):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout  # attention probabilities and the residual branch
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.rng = rng

    def forward(self, x, kv=None):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if kv is not None:
            k, v = kv.update(k, v)  # (B, nh, T_so_far, hs)
        gens = replica_generators(self.rng, x.device)
        y = causal_attention(q, k, v, p=self.dropout, training=self.training, generators=gens)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble head outputs side by side
        return dropout(self.c_proj(y), self.dropout, training=self.training, generators=gens)


class MLP(nn.Module):
    def __init__(self, config, rng):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate=config.gelu_approximate)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout
        self.rng = rng

    def forward(self, x):
        gens = replica_generators(self.rng, x.device)
        return dropout(self.c_proj(self.gelu(self.c_fc(x))), self.dropout, training=self.training, generators=gens)


def replica_generators(rng, device):
    g = rng.generator(0, device)
    return None if g is None else [g]


class Block(nn.Module):
    def __init__(self, config, rng):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, rng)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config, rng)

    def forward(self, x, kv=None):
        x = x + self.attn(self.ln_1(x), kv)
        x = x + self.mlp(self.ln_2(x))
        return x


def init_gpt2_param_(name, p, n_layer):
    """GPT-2 init of one parameter: normal(0, 0.02), zero biases, unit LayerNorm weights, residual projections
    scaled by 1/sqrt(2*n_layer)."""
    if name.endswith("c_proj.weight"):
        torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))
    elif p.dim() >= 2:  # Linear weights and embeddings
        torch.nn.init.normal_(p, mean=0.0, std=0.02)
    elif "ln_" in name and name.endswith("weight"):
        torch.nn.init.ones_(p)
    else:  # biases
        torch.nn.init.zeros_(p)


def init_gpt2_weights_(model, n_layer):
    for name, p in model.named_parameters():
        init_gpt2_param_(name, p, n_layer)


def gpt_init_tensors(config):
    """GPT(config)'s initial weights one tensor at a time, drawn from torch's RNG exactly as GPT(config) draws
    them, so that a model built on the meta device materialises its own part of each (DistributedGPT: its shards)
    bitwise equal to GPT's, holding at most one full parameter, never the whole model. Yields (name, tensor) in
    named_parameters order; the RNG ends where GPT(config) leaves it."""
    with torch.device("meta"):
        meta = GPT(config)  # shapes only: meta tensors draw nothing from the RNG
    # construction: nn.Linear and nn.Embedding draw their default init, in construction order (= modules() order);
    # GPT's init overwrites them, but the draws move the RNG, so they are replayed on a same-shaped module
    for m in meta.modules():
        if isinstance(m, nn.Linear):
            nn.Linear(m.in_features, m.out_features, bias=m.bias is not None)
        elif isinstance(m, nn.Embedding):
            nn.Embedding(m.num_embeddings, m.embedding_dim)
    for name, p in meta.named_parameters():  # then GPT-2's init, parameter by parameter
        full = torch.empty(p.shape)
        init_gpt2_param_(name, full, config.n_layer)
        yield name, full


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.vocab_size is not None
        assert config.block_size is not None
        self.config = config
        self.rng = DropoutRNG()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList([Block(config, self.rng.for_layer(i)) for i in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # weight tying (https://paperswithcode.com/method/weight-tying)
        self.transformer.wte.weight = self.lm_head.weight
        init_gpt2_weights_(self, config.n_layer)

    def get_num_params(self, non_embedding=True):
        """Parameter count; position embeddings excluded by default (the token
        embedding counts, because it is tied to lm_head)."""
        n_params = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n_params -= self.transformer.wpe.weight.numel()
        return n_params

    def forward(self, idx, targets=None, *, kv_cache=None):
        """Logits and loss; with a KVCache, idx holds only the tokens after those already cached."""
        pos = positions(idx, self.config.block_size, kv_cache)
        x = self.embed(idx, pos)  # (b, t, C)
        for i, block in enumerate(self.transformer.h):
            x = block(x, None if kv_cache is None else kv_cache.layers[i])
        if kv_cache is not None:
            kv_cache.advance(idx.size(1))
        x = self.transformer.ln_f(x)
        return lm_head_and_loss(self.lm_head, x, targets)

    def embed(self, idx, pos):
        """Token + position embeddings with embedding dropout (the replica's mask: equal on every tp shard)."""
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        return dropout(x, self.config.dropout, training=self.training, generators=replica_generators(self.rng, x.device))

    def crop_block_size(self, block_size):
        """Model surgery: shrink the block size (e.g. load GPT-2's 1024 and use a smaller context)."""
        assert block_size <= self.config.block_size
        self.config.block_size = block_size
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])

    @classmethod
    def from_pretrained(cls, model_type, override_args=None):
        """Load Hugging Face GPT-2 weights (needs the network or the HF cache)."""
        if model_type not in PRETRAINED_SIZES:
            raise ValueError(f"model_type must be one of {sorted(PRETRAINED_SIZES)}, got {model_type!r}")
        override_args = override_args or {}
        if set(override_args) - {"dropout"}:
            raise ValueError(f"only dropout can be overridden, got {sorted(override_args)}")
        from transformers import GPT2LMHeadModel

        print(f"loading weights from pretrained gpt: {model_type}")
        config = GPTConfig(**PRETRAINED_SIZES[model_type], **GPT2_FIXED, **override_args)
        model = cls(config)
        model.load_state_dict(convert_hf_gpt2_state_dict(GPT2LMHeadModel.from_pretrained(model_type).state_dict()))
        return model

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return configure_adamw(self, weight_decay, learning_rate, betas, device_type)

    def estimate_mfu(self, fwdbwd_per_iter, dt, *, device=None):
        """Model FLOPs utilization: achieved FLOP/s over the peak of the actual device (all the devices one
        model replica runs on)."""
        return estimate_mfu(self, fwdbwd_per_iter, dt, device=device, n_devices=self.devices_per_replica)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, *, use_cache=True):
        return generate(self, idx, max_new_tokens, temperature=temperature, top_k=top_k, use_cache=use_cache)

    # --- the interface train.py, bench.py, sample.py and experiment.py use for either model ---
    # DistributedGPT overrides these; for GPT they are the plain operations or no-ops.

    devices_per_replica = 1
    group = None  # the tensor-parallel group (tp_comm.SimulatedTP / RealTP): DistributedGPT's; GPT has none
    sharding = None  # how parameters are split over that group (sharding.TPSharding): none for GPT

    def desynced_after(self, layer):
        """Whether the residual stream leaving block `layer` is desynced (a 'parallel' block): never for GPT."""
        return False

    def seed_dropout(self, *key):
        """Key the dropout masks of the next forward passes, e.g. (seed, iteration, micro_batch); no key: torch's
        global RNG (see DropoutRNG)."""
        self.rng.set_key(key or None)

    def gpt_state_dict(self):
        """The weights in GPT's unsharded layout (what checkpoints hold), gathered from wherever they are sharded:
        tensor-parallel shards (DistributedGPT) and FSDP's data-parallel shards (DTensors). A collective then."""
        return {k: self.gpt_layout_whole(k, v) for k, v in self.state_dict().items()}

    def load_gpt_state_dict(self, state_dict):
        own = self.state_dict()
        missing = sorted(set(own) - set(state_dict))
        if missing:
            raise KeyError(f"GPT state dict lacks {missing[:3]}")
        self.load_state_dict({k: laid_out_like(self.gpt_layout_part(k, state_dict[k]), own[k]) for k in own})

    def gpt_layout_part(self, name, full):
        """This rank's tensor-parallel part of a GPT-layout tensor (GPT: all of it)."""
        return full

    def gpt_layout_whole(self, name, part):
        """The GPT-layout tensor from this rank's part of it (FSDP shards gathered; GPT: nothing else)."""
        return whole(part)

    def _param_names(self, optimizer):
        names = {id(p): n for n, p in self.named_parameters()}
        return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]

    def gpt_optimizer_state(self, optimizer):
        """The optimizer's state dict in GPT's layout (same parameter indices, unsharded moments)."""
        sd = optimizer.state_dict()
        names = self._param_names(optimizer)
        state = {i: {k: self.gpt_layout_whole(names[i], v) if v.dim() > 0 else v for k, v in s.items()}
                 for i, s in sd["state"].items()}
        return {"state": state, "param_groups": sd["param_groups"]}

    def load_gpt_optimizer_state(self, optimizer, state_dict):
        names, params = self._param_names(optimizer), [p for g in optimizer.param_groups for p in g["params"]]
        state = {i: {k: laid_out_like(self.gpt_layout_part(names[i], v), params[int(i)]) if v.dim() > 0 else v
                     for k, v in s.items()} for i, s in state_dict["state"].items()}
        optimizer.load_state_dict({"state": state, "param_groups": state_dict["param_groups"]})

    def materialize_(self, device):
        """A model built under torch.device('meta') (init_device='meta'), possibly FSDP-sharded already: allocate
        this rank's parameters on device and give them GPT(config)'s initial weights, bitwise, one full parameter
        at a time (each rank keeps its tensor-parallel part, and of that its FSDP shard)."""
        self.to_empty(device=device)
        self.transformer.wte.weight = self.lm_head.weight  # to_empty allocates the tied weight twice: tie again
        own = dict(self.named_parameters())
        with torch.no_grad():
            for name, full in gpt_init_tensors(self.gpt_config()):
                own[name].copy_(laid_out_like(self.gpt_layout_part(name, full), own[name]))
        return self

    def gpt_config(self):
        return self.config

    def sync_replicated_grads(self):
        """After backward: make the gradients of parameters that several ranks hold whole. Nothing to do here."""

    def clip_grad_norm_(self, max_norm):
        """Clip by the norm of the whole model's gradient; returns that norm (torch's handles FSDP's DTensors)."""
        return whole(torch.nn.utils.clip_grad_norm_(self.parameters(), max_norm))

    def grad_sq_norm(self, named_grads):
        """The squared norm of these (GPT name, gradient) pairs as a part of the whole model's gradient (what
        clip_grad_norm_ measures), so that pipeline stages holding parts of the model can add theirs."""
        return grad_sq_sums(named_grads, lambda name: 0, 1)[0]

    def reset_comm_counts(self):
        """Start counting collectives afresh (GPT runs none)."""

    def comm_report(self, *, micro_steps, tokens):
        """Collectives counted since reset_comm_counts, per forward/backward pass of `tokens` tokens: a dict of
        metrics (empty for GPT, which communicates nothing)."""
        return {}

    def comm_per_forward(self, idx):
        """The collectives of one forward+backward pass on idx (see comm_report); gradients are left cleared."""
        self.reset_comm_counts()
        _, loss = self(idx, idx)
        loss.backward()
        self.zero_grad(set_to_none=True)
        report = self.comm_report(micro_steps=1, tokens=idx.numel())
        self.reset_comm_counts()
        return report


GPT2_FIXED = dict(vocab_size=50257, block_size=1024, bias=True, gelu_approximate="tanh")  # every GPT-2 size
PRETRAINED_SIZES = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),  # 124M params
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),  # 350M params
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),  # 774M params
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),  # 1558M params
}


def convert_hf_gpt2_state_dict(hf_sd):
    """Hugging Face GPT2LMHeadModel state dict -> this GPT's state dict.
    HF uses Conv1D modules whose weights are the transpose of nn.Linear's."""
    transposed = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    sd = {}
    for k, v in hf_sd.items():
        if k.endswith(".attn.masked_bias") or k.endswith(".attn.bias"):
            continue  # causal-mask buffers, not parameters
        sd[k] = v.t().contiguous() if k.endswith(transposed) else v
    if "lm_head.weight" not in sd:
        sd["lm_head.weight"] = sd["transformer.wte.weight"]
    return sd


def positions(idx, block_size, kv_cache=None):
    """Positions of idx's tokens (after the cached ones), checked against the block size."""
    start = 0 if kv_cache is None else kv_cache.pos
    t = idx.size(1)
    if start + t > block_size:
        raise ValueError(f"sequence length {start + t} exceeds block_size {block_size}")
    return torch.arange(start, start + t, dtype=torch.long, device=idx.device)


def lm_head_and_loss(lm_head, x, targets):
    """Shared tail of both models: logits and cross-entropy (ignore_index=-1)."""
    if targets is not None:
        logits = lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
    else:  # inference: only the last position is needed
        logits = lm_head(x[:, [-1], :])
        loss = None
    return logits, loss


def grad_sq_sums(named_grads, part, n_parts):
    """Sums of squares of the local gradients in n_parts parts (part(name) -> index), in fp32 at least (float64
    kept, as torch's clipping); FSDP's DTensor gradients are summed over their data-parallel shards as well."""
    grads = [g for _, g in named_grads]
    acc = torch.promote_types(grads[0].dtype, torch.float32)
    sq = torch.zeros(n_parts, dtype=acc, device=grads[0].device)
    for name, g in named_grads:
        sq[part(name)] += local(g).to(acc).pow(2).sum()
    mesh = getattr(grads[0], "device_mesh", None)
    if mesh is not None:
        torch.distributed.all_reduce(sq, group=mesh.get_group())
    return sq


def clip_to_norm_(grads, total, max_norm):
    """Scale the gradients by min(1, max_norm / total) as torch.nn.utils.clip_grad_norm_ does; returns total."""
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype))
    return total


def configure_adamw(model, weight_decay, learning_rate, betas, device_type):
    """AdamW with weight decay on >=2-D params only (matmuls, embeddings), fused where available."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = "fused" in inspect.signature(torch.optim.AdamW).parameters and device_type == "cuda"
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **({"fused": True} if fused else {}))


# Dense bf16/fp16 tensor-core peak FLOP/s (no sparsity), from the vendors' data sheets.
PEAK_FLOPS = {
    "H200": 989e12, "H100": 989e12, "A100": 312e12, "A10": 125e12, "L4": 121e12, "L40": 181e12,
    "4090": 165e12, "3090": 71e12, "V100": 125e12, "T4": 65e12,
}


def device_peak_flops(device):
    """Peak FLOP/s of the device the model runs on; None when unknown (e.g. CPU)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, flops in PEAK_FLOPS.items():
        if key in name:
            return flops
    return None


def estimate_mfu(model, fwdbwd_per_iter, dt, *, device=None, n_devices=1):
    """MFU per the PaLM paper (appendix B): FLOP/s achieved by `model` (on `n_devices` devices together, e.g.
    the tp ranks of a replica) over their peak. None if the device's peak is unknown (CPU)."""
    cfg = model.config
    N = model.get_num_params()
    L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.block_size
    flops_per_token = 6 * N + 12 * L * H * Q * T
    flops_achieved = flops_per_token * T * fwdbwd_per_iter / dt
    peak = device_peak_flops(device if device is not None else next(model.parameters()).device)
    return None if peak is None else flops_achieved / (peak * n_devices)


@torch.no_grad()
def generate(model, idx, max_new_tokens, *, temperature=1.0, top_k=None, use_cache=True):
    """Autoregressive sampling from a (b, t) index tensor; works for any model with the GPT forward API. With the
    KV cache each step feeds only the new token; once the sequence outgrows block_size the context window slides,
    which absolute position embeddings cannot do from a cache, so from then on each step recomputes the window."""
    block_size = model.config.block_size
    cache = KVCache(model.config.n_layer, block_size) if use_cache else None
    for _ in range(max_new_tokens):
        if cache is not None and idx.size(1) <= block_size:
            logits, _ = model(idx[:, cache.pos:], kv_cache=cache)
        else:
            logits, _ = model(idx[:, -block_size:])
        idx = torch.cat((idx, sample_next(logits[:, -1, :], temperature=temperature, top_k=top_k)), dim=1)
    return idx


def sample_next(logits, *, temperature, top_k):
    """(b, vocab) logits -> (b, 1) sampled tokens; temperature 0 is greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits[logits < v[:, [-1]]] = -float("Inf")
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
