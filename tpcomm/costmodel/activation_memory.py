"""
Activation memory of one transformer layer with and without sequence parallelism: a counted prediction
(Megatron's count, Korthikanti et al., arXiv 2205.05198, section 4) and a measurement of what autograd really
saves for backward (ActivationMemory; the pipeline benchmark uses it too). docs/overlap.md has the equations.

Per layer, N = B*T tokens, C = n_embd, a = n_head, s = T, t = tp, e bytes per activation value, m bytes per
dropout mask value (Megatron: e = 2, m = 1; this repo's keyed masks are float32, m = 4):
    replicated per token: LN1 and LN2 inputs, the attention and MLP inputs (4 C values) and the two output
                          dropout masks (2 C mask values): t-fold fewer with sequence parallelism (sharded)
    sharded per token:    q, k, v, the attention output, c_fc's output and GELU's (12 C / t values)
    attention scores:     the softmax output (a s / t values per token), its dropout mask and the dropped copy
so bytes = N C [(4 e + 2 m d) / (t if SP else 1) + 12 e / t] + N a s / t [e + d (e + m)], d = 1 with dropout.
At e = 2, m = 1, d = 1 this is Megatron's s b h (10 + 24/t + 5 a s/(h t)) and, SP, s b h/t (34 + 5 a s/h).
"""

import torch


def predicted_activation_bytes(*, batch_size, seq_len, n_embd, n_head, tp, sequence_parallel, dropout=True,
                               value_bytes=2, mask_bytes=1):
    """Bytes of activations one layer saves for backward per rank (see the module docstring)."""
    n, d = batch_size * seq_len, 1 if dropout else 0
    replicated = (4 * value_bytes + 2 * mask_bytes * d) / (tp if sequence_parallel else 1)
    sharded = 12 * value_bytes / tp
    scores = n_head * seq_len / tp * (value_bytes + d * (value_bytes + mask_bytes))
    return n * n_embd * (replicated + sharded) + n * scores


def measure_saved_bytes(model, idx, targets):
    """Peak bytes of the tensors autograd saves for backward during model(idx, targets) and its backward,
    counted once per storage, parameters excluded (ActivationMemory). Run each tp rank of a real-mode model: a
    simulated one holds every shard (and the whole stream) in one process."""
    memory = ActivationMemory(model.parameters())
    with memory.hooks():
        _, loss = model(idx, targets)
    peak = memory.peak
    loss.backward()
    model.zero_grad(set_to_none=True)
    return peak


class ActivationMemory:
    """Peak bytes of the tensors autograd saves for backward while a schedule runs (the activations of the
    micro-batches in flight: GPipe holds all m, 1F1B at most p on the first stage), counted once per storage,
    parameters excluded. Device-independent, so it works on CPU where torch keeps no memory statistics."""

    def __init__(self, params):
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.live, self.bytes, self.peak = {}, 0, 0

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, lambda held: held.tensor)

    def _pack(self, t):
        key = t.untyped_storage().data_ptr()
        if key in self.params or t.device.type == "meta":
            return _Held(t, None)
        count, nbytes = self.live.get(key, (0, t.untyped_storage().nbytes()))
        if count == 0:
            self.bytes += nbytes
            self.peak = max(self.peak, self.bytes)
        self.live[key] = (count + 1, nbytes)
        return _Held(t, (self, key))

    def release(self, key):
        count, nbytes = self.live[key]
        if count == 1:
            del self.live[key]
            self.bytes -= nbytes
        else:
            self.live[key] = (count - 1, nbytes)


class _Held:
    """A saved tensor; when autograd frees it (after its backward), its bytes leave the count."""

    def __init__(self, tensor, owner):
        self.tensor, self.owner = tensor, owner

    def __del__(self):
        if self.owner is not None:
            tracker, key = self.owner
            tracker.release(key)


# ---------- simulated tp's activations against GPT's, for one GPU (docs/gpu.md) ----------
# python -m tpcomm.costmodel.activation_memory: measured on CPU per token under bf16 autocast, scaled by shape

SIM_KINDS = ("gpt", "tp", "spd", "parallel", "ladder")
PROBE = dict(n_head=8, block_size=128, batch_size=1, vocab_size=512, tp=8)  # the measured models (dropout 0)
FIT_SHAPES = (("GPT-2 124M", 12, 768), ("GPT-2 350M", 24, 1024), ("GPT-2 774M", 36, 1280), ("1.3B", 24, 2048),
              ("GPT-2 1.5B", 48, 1600), ("2.7B", 32, 2560), ("6.7B", 32, 4096))


def saved_bytes(kind, *, n_layer, n_embd, vocab_size, n_head, block_size, batch_size, tp):
    """Peak saved bytes of one bf16-autocast training pass of GPT (kind 'gpt') or
    simulated tp `tp`, all `kind`."""
    from model import GPT, GPTConfig
    from tensor_parallel_model import DistributedGPT

    torch.manual_seed(0)
    gpt = GPT(GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=n_layer, n_head=n_head,
                        n_embd=n_embd, dropout=0.0, bias=False))
    model = gpt if kind == "gpt" else DistributedGPT.from_gpt(gpt, tp, [kind] * n_layer)
    g = torch.Generator().manual_seed(0)
    idx, targets = (torch.randint(vocab_size, (batch_size, block_size), generator=g) for _ in range(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return measure_saved_bytes(model.train(), idx, targets)


def per_token_fit(kind, *, widths=(256, 512), probe=PROBE):
    """(a, w): a layer saves a * n_embd bytes per token of activations, plus autocast's bf16 copies of its 12
    C^2 weights, w bytes per parameter (a cache for the pass, not per token): from 1- and 2-layer models at
    two widths, y(C) = a C + w 12 C^2 / N per token, N the probe's tokens."""
    n = probe["batch_size"] * probe["block_size"]
    y = []
    for c in widths:
        one, two = (saved_bytes(kind, n_layer=k, n_embd=c, **probe) for k in (1, 2))
        y.append((two - one) / n)
    (c1, c2), (y1, y2) = widths, y
    w = (y2 / c2 - y1 / c1) * n / (12 * (c2 - c1))
    return y1 / c1 - w * 12 * c1 / n, w


def head_per_token(*, width=256, vocab=(512, 1024), probe=PROBE):
    """(h0, hv): outside the blocks a pass saves h0 + hv * vocab_size bytes per token (embedding, ln_f, logits
    and the loss; the same for every block type without loss_parallel): GPT at 1 layer, two vocabularies, less
    its layer (measured at 1 and 2 layers)."""
    n = probe["batch_size"] * probe["block_size"]
    rest = []
    for v in vocab:
        p = dict(probe, vocab_size=v)
        one, two = (saved_bytes("gpt", n_layer=k, n_embd=width, **p) for k in (1, 2))
        rest.append((2 * one - two) / n)
    hv = (rest[1] - rest[0]) / (vocab[1] - vocab[0])
    return rest[0] - hv * vocab[0], hv


def training_bytes(shape, a, w, head, *, tokens, vocab=50304):
    """One GPU's memory for a bf16-autocast training step (no activation checkpointing): fp32 weights,
    gradients and AdamW's two moments (16 bytes a parameter), autocast's bf16 weight copies (w a block
    parameter) and the activations of `tokens` tokens (a C per token and layer, plus the head's)."""
    _, n_layer, c = shape
    block_params = 12 * n_layer * c * c
    return 16 * (block_params + vocab * c) + w * block_params + tokens * (n_layer * a * c + head[0] + head[1]
                                                                          * vocab)


def main(*, tokens=8 * 1024, gpu_bytes=80e9, usable=0.9):
    head = head_per_token()
    fits = {kind: per_token_fit(kind) for kind in SIM_KINDS}
    print(f"head: {head[0]:.0f} + {head[1]:.2f} x vocab bytes per token")
    print("| model | activations per token and layer | vs GPT | bf16 weight copies | GPT-2 124M | 1.3B | "
          "largest that " f"fits {gpu_bytes / 1e9:.0f} GB ({usable:.0%}), batch {tokens} tokens |")
    for kind, (a, w) in fits.items():
        gb = {s[0]: training_bytes(s, a, w, head, tokens=tokens) / 1e9 for s in FIT_SHAPES}
        best = max((s for s in FIT_SHAPES if gb[s[0]] <= usable * gpu_bytes / 1e9),
                   key=lambda s: 12 * s[1] * s[2] ** 2, default=None)
        largest = f"{best[0]} ({gb[best[0]]:.0f} GB)" if best else "none"
        print(f"| {kind} | {a:.1f} x n_embd B | {a / fits['gpt'][0]:.2f}x | {w:.2f} B/param | "
              f"{gb['GPT-2 124M']:.0f} GB | {gb['1.3B']:.0f} GB | {largest} |")


if __name__ == "__main__":
    main()
