"""Generation with a KV cache against recomputing the whole prefix, for GPT and DistributedGPT (every block
type, tp_size 1/2/4, simulated): the logits of every step and the greedy tokens."""

import pytest
import torch

from model import KVCache
from tensor_parallel_model import DistributedGPT
from test_tensor_parallel import N_LAYER, VOCAB, make_gpt

# fp32: a cached step computes each new token's attention over stored keys instead of the whole causal matrix;
# the same sums grouped differently, measured <1e-7 on these logits; 1e-5 leaves room, a wrong position moves
# them ~1e-1
TOL = dict(rtol=1e-5, atol=1e-5)
MODELS = [("gpt", 1, None)] + [(kind, tp, [kind] * N_LAYER) for kind in ("tp", "spd", "parallel")
                               for tp in (1, 2, 4)] \
    + [("mixed", 2, ["parallel", "spd", "tp", "parallel"])]


def build(tp, block_types):
    gpt = make_gpt().eval()
    return gpt if block_types is None else DistributedGPT.from_gpt(gpt, tp, block_types).eval()


def stepwise_logits(model, tokens, prompt_len, *, cached):
    """Logits for the next token after each prefix tokens[:, :t], t = prompt_len .. len: fed all at once
    (recomputed) or prompt first and then one token per step through a KV cache."""
    with torch.no_grad():
        if not cached:
            return torch.stack([model(tokens[:, :t])[0][:, -1] for t in range(prompt_len,
                                                                              tokens.size(1) + 1)], 1)
        cache = KVCache(model.config.n_layer, model.config.block_size)
        out = [model(tokens[:, :prompt_len], kv_cache=cache)[0][:, -1]]
        for t in range(prompt_len, tokens.size(1)):
            out.append(model(tokens[:, t:t + 1], kv_cache=cache)[0][:, -1])
        return torch.stack(out, 1)


@pytest.mark.parametrize("kind, tp, block_types", MODELS, ids=[f"{k}-tp{t}" for k, t, _ in MODELS])
def test_cached_generation_equals_recomputing(kind, tp, block_types):
    model = build(tp, block_types)
    prompt = torch.randint(VOCAB, (2, 5), generator=torch.Generator().manual_seed(3))
    # 45 > block_size 32: the window slides
    greedy = model.generate(prompt, 40, temperature=0, use_cache=True)
    assert torch.equal(greedy, model.generate(prompt, 40, temperature=0, use_cache=False))
    tokens = greedy[:, :30]
    torch.testing.assert_close(stepwise_logits(model, tokens, 5, cached=True),
                               stepwise_logits(model, tokens, 5, cached=False), **TOL)
    torch.manual_seed(7)
    sampled = model.generate(prompt, 20, temperature=1.0, top_k=10, use_cache=True)
    torch.manual_seed(7)
    assert torch.equal(sampled, model.generate(prompt, 20, temperature=1.0, top_k=10, use_cache=False))


def test_cache_comparison_can_fail():
    """A cache that loses track of positions (every step at position 0 of the cache) gives other logits."""
    model = build(2, ["parallel", "spd", "tp", "parallel"])
    tokens = torch.randint(VOCAB, (2, 20), generator=torch.Generator().manual_seed(4))
    ref = stepwise_logits(model, tokens, 5, cached=False)
    advance = KVCache.advance
    try:
        KVCache.advance = lambda self, t: None
        with pytest.raises(AssertionError):
            torch.testing.assert_close(stepwise_logits(model, tokens, 5, cached=True), ref, **TOL)
    finally:
        KVCache.advance = advance
