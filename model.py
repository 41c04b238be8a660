"""
The single-device reference GPT (GPT-2 architecture), after nanoGPT: config, LayerNorm, attention (with a KV
cache for generation), MLP, Block, GPT with generate, from_pretrained, configure_optimizers and estimate_mfu.
Holds no parallelism: every parallel path in this repository is tested against it.
"""

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
    # (Hugging Face's 'gelu_new'). from_pretrained sets 'tanh'. Same values as torch's
    # F.gelu(approximate=...).
    gelu_approximate: str = "none"


GELU_FORMS = ("none", "tanh")
# GPTConfig fields that nanoGPT's own GPTConfig has: a checkpoint's model_args holds exactly these, so
# nanoGPT's scripts read checkpoints written here and the other way round.
NANOGPT_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")


class KVCache:
    """Keys and values of the tokens seen so far, one entry per layer, so that generation feeds only the new
    tokens. Each layer stores them in its own attention layout (DistributedGPT: each shard's own heads), for
    up to `size` positions (the model's block_size: absolute position embeddings cannot slide)."""

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
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x, kv=None):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if kv is not None:
            k, v = kv.update(k, v)  # (B, nh, T_so_far, hs)
        y = causal_attention(q, k, v, self.attn_dropout if self.training and self.dropout > 0 else None)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble head outputs side by side
        return self.resid_dropout(self.c_proj(y))


def causal_attention(q, k, v, drop=None):
    """Causal attention of (B, nh, Tq, hs) queries on (B, nh, Tk, hs) keys/values. Tk > Tq when a KV
    cache holds earlier tokens: the queries are the last Tq positions. With `drop` (a dropout module
    for the attention probabilities) they are computed explicitly, as nanoGPT's non-flash path, so
    that its mask is the module's."""
    Tq, Tk = q.size(-2), k.size(-2)
    if Tk > Tq:  # cached generation (eval): query i sits at position Tk - Tq + i
        mask = None if Tq == 1 else torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if drop is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    causal = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril()
    att = F.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
    return drop(att) @ v


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate=config.gelu_approximate)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

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


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.vocab_size is not None
        assert config.block_size is not None
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
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
        """Token + position embeddings, with dropout."""
        return self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (b, t, C)

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
        hf = GPT2LMHeadModel.from_pretrained(model_type)
        model.load_state_dict(convert_hf_gpt2_state_dict(hf.state_dict()))
        return model

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return configure_adamw(self, weight_decay, learning_rate, betas, device_type)

    def estimate_mfu(self, fwdbwd_per_iter, dt, *, device=None, n_devices=1, dtype=None):
        """Model FLOPs utilization: achieved FLOP/s over the peak of the actual device(s) the model runs on,
        for the training dtype ('bfloat16', 'float16', 'float32'); None where that peak is unknown."""
        return estimate_mfu(self, fwdbwd_per_iter, dt, device=device, n_devices=n_devices, dtype=dtype)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, *, use_cache=True):
        return generate(self, idx, max_new_tokens, temperature=temperature, top_k=top_k, use_cache=use_cache)


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


# Dense (no sparsity) peak FLOP/s per GPU, from the vendors' data sheets, by the exact name
# torch.cuda.get_device_name reports and by the training dtype: bf16/fp16 are the tensor-core rates with fp32
# accumulation (what autocast's matmuls use); float32 is TF32's (train.py and bench.py allow TF32 matmuls on
# CUDA), or the fp32 CUDA-core rate where there is no TF32 (V100, T4). Variants of one chip differ (H100 SXM
# 989, NVL 835, PCIe 756 bf16 TFLOP/s), so names are never matched by substring: an unknown name gives no MFU,
# not another's.
_H100_SXM = dict(bfloat16=989e12, float16=989e12, float32=495e12)  # H100 SXM5, H200 SXM, GH200
_NVL = dict(bfloat16=835e12, float16=835e12, float32=418e12)  # H100 NVL, H200 NVL (per GPU)
_A100 = dict(bfloat16=312e12, float16=312e12, float32=156e12)  # every A100 form factor
# no bf16, TF32
_V100_SXM2, _V100_PCIE = dict(float16=125e12, float32=15.7e12), dict(float16=112e12, float32=14e12)
PEAK_FLOPS = {
    "NVIDIA H100 80GB HBM3": _H100_SXM,
    "NVIDIA H100 PCIe": dict(bfloat16=756e12, float16=756e12, float32=378e12),
    "NVIDIA H100 NVL": _NVL,
    "NVIDIA H200": _H100_SXM,
    "NVIDIA H200 NVL": _NVL,
    "NVIDIA GH200 480GB": _H100_SXM,
    "NVIDIA A100-SXM4-40GB": _A100, "NVIDIA A100-SXM4-80GB": _A100,
    "NVIDIA A100-PCIE-40GB": _A100, "NVIDIA A100 80GB PCIe": _A100,
    "NVIDIA A10": dict(bfloat16=125e12, float16=125e12, float32=62.5e12),
    "NVIDIA L4": dict(bfloat16=121e12, float16=121e12, float32=60e12),
    "NVIDIA L40": dict(bfloat16=181e12, float16=181e12, float32=90.5e12),
    "NVIDIA L40S": dict(bfloat16=362e12, float16=362e12, float32=183e12),
    "NVIDIA GeForce RTX 4090": dict(bfloat16=165e12, float16=165e12, float32=82.6e12),
    "NVIDIA GeForce RTX 3090": dict(bfloat16=71e12, float16=71e12, float32=35.6e12),
    "Tesla V100-SXM2-16GB": _V100_SXM2, "Tesla V100-SXM2-32GB": _V100_SXM2,
    "Tesla V100-PCIE-16GB": _V100_PCIE, "Tesla V100-PCIE-32GB": _V100_PCIE,
    "Tesla T4": dict(float16=65e12, float32=8.1e12),
}


def device_peak_flops(device, dtype):
    """Peak FLOP/s of the device the model runs on for the training dtype ('float32', 'bfloat16', 'float16');
    None when not known (CPU, a GPU or dtype missing from PEAK_FLOPS, no dtype)."""
    device = torch.device(device)
    if device.type != "cuda" or dtype is None:
        return None
    return PEAK_FLOPS.get(torch.cuda.get_device_name(device), {}).get(str(dtype).removeprefix("torch."))


def estimate_mfu(model, fwdbwd_per_iter, dt, *, device=None, n_devices=1, dtype=None):
    """MFU per the PaLM paper (appendix B): FLOP/s achieved by `model` (on `n_devices` devices together, e.g.
    the tp ranks of a replica) over their peak for the training dtype. None if that peak is unknown (CPU, an
    unlisted GPU, no dtype given)."""
    cfg = model.config
    N = model.get_num_params()
    L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.block_size
    flops_per_token = 6 * N + 12 * L * H * Q * T
    flops_achieved = flops_per_token * T * fwdbwd_per_iter / dt
    peak = device_peak_flops(device if device is not None else next(model.parameters()).device, dtype)
    return None if peak is None else flops_achieved / (peak * n_devices)


@torch.no_grad()
def generate(model, idx, max_new_tokens, *, temperature=1.0, top_k=None, use_cache=True):
    """Autoregressive sampling from a (b, t) index tensor; works for any model with the GPT forward API.
    With the KV cache each step feeds only the new token; once the sequence outgrows block_size the
    context window slides, which absolute position embeddings cannot do from a cache, so from then on
    each step recomputes the window."""
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
