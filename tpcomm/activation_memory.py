"""
Activation memory of one transformer layer with and without sequence parallelism: a counted prediction (Megatron's
count, Korthikanti et al., arXiv 2205.05198, section 4) and a measurement of what autograd really saves for backward
(ActivationMemory; the pipeline benchmark uses it too). docs/overlap.md has the equations.

Per layer, N = B*T tokens, C = n_embd, a = n_head, s = T, t = tp, e bytes per activation value, m bytes per dropout
mask value (Megatron: e = 2, m = 1; this repo's keyed masks are float32, m = 4):
    replicated per token: LN1 and LN2 inputs, the attention and MLP inputs (4 C values) and the two output dropout
                          masks (2 C mask values): t-fold fewer with sequence parallelism (token-sharded)
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
    """Peak bytes of the tensors autograd saves for backward during model(idx, targets) and its backward, counted
    once per storage, parameters excluded (ActivationMemory). Run each tp rank of a real-mode model: a simulated
    one holds every shard (and the whole stream) in one process."""
    memory = ActivationMemory(model.parameters())
    with memory.hooks():
        _, loss = model(idx, targets)
    peak = memory.peak
    loss.backward()
    model.zero_grad(set_to_none=True)
    return peak


def sp_saving(**shape):
    """(bytes without SP, bytes with SP) of one layer, predicted; shape: predicted_activation_bytes's arguments."""
    shape.pop("sequence_parallel", None)
    return (predicted_activation_bytes(**shape, sequence_parallel=False),
            predicted_activation_bytes(**shape, sequence_parallel=True))


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
