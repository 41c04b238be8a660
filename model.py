"""
The single-device reference GPT (GPT-2 architecture), after nanoGPT.
Holds no parallelism: every parallel path in this repo is tested against it.
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
        self.attn_dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attn_dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble head outputs side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
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

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


def init_gpt2_weights_(model, n_layer):
    """GPT-2 init: normal(0, 0.02), zero biases, residual projections scaled by 1/sqrt(2*n_layer)."""
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight"):
            torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))
        elif p.dim() >= 2:  # Linear weights and embeddings
            torch.nn.init.normal_(p, mean=0.0, std=0.02)
        elif "ln_" in name and name.endswith("weight"):
            torch.nn.init.ones_(p)
        else:  # biases
            torch.nn.init.zeros_(p)


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

    def forward(self, idx, targets=None):
        device = idx.device
        b, t = idx.size()
        if t > self.config.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size {self.config.block_size}")
        pos = torch.arange(0, t, dtype=torch.long, device=device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (b, t, C)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        return lm_head_and_loss(self.lm_head, x, targets)

    def crop_block_size(self, block_size):
        """Model surgery: shrink the block size (e.g. load GPT-2's 1024 and use a smaller context)."""
        assert block_size <= self.config.block_size
        self.config.block_size = block_size
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])
        for block in self.transformer.h:
            if hasattr(block.attn, "bias"):
                block.attn.bias = block.attn.bias[:, :, :block_size, :block_size]

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
        config = GPTConfig(**PRETRAINED_SIZES[model_type], vocab_size=50257, block_size=1024, bias=True,
                           **override_args)
        model = cls(config)
        model.load_state_dict(convert_hf_gpt2_state_dict(GPT2LMHeadModel.from_pretrained(model_type).state_dict()))
        return model

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return configure_adamw(self, weight_decay, learning_rate, betas, device_type)

    def estimate_mfu(self, fwdbwd_per_iter, dt, *, device=None):
        """Model FLOPs utilization: achieved FLOP/s over the peak of the actual device."""
        return estimate_mfu(self, fwdbwd_per_iter, dt, device=device)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        return generate(self, idx, max_new_tokens, temperature=temperature, top_k=top_k)


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
def generate(model, idx, max_new_tokens, *, temperature=1.0, top_k=None):
    """Autoregressive sampling from a (b, t) index tensor; works for any model with the GPT forward API."""
    for _ in range(max_new_tokens):
        idx_cond = idx if idx.size(1) <= model.config.block_size else idx[:, -model.config.block_size:]
        logits, _ = model(idx_cond)
        logits = logits[:, -1, :] / temperature
        if top_k is not None:
            v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
            logits[logits < v[:, [-1]]] = -float("Inf")
        probs = F.softmax(logits, dim=-1)
        idx = torch.cat((idx, torch.multinomial(probs, num_samples=1)), dim=1)
    return idx
