"""
Head grouping (Sync-Point Drop, arXiv 2502.20727, section 3.3) for an extremely sensitive block: before
sharding, the attention heads are grouped so that similar heads share a shard, and the MLP hidden units follow
the heads they serve; the block is then sharded in that order (a permutation of heads and units: the same GPT,
other shards). tpcomm/convert/sync_point_drop.py uses it.
"""

import math

import torch
from torch.nn import functional as F


def permute_heads_and_units(state_dict, perms, *, n_head):
    """A GPT-layout state dict with, per layer i in `perms` ({i: (head_perm, unit_perm)}, either may be None),
    the attention heads in the order head_perm (q, k and v rows of c_attn and the matching input columns of
    attn.c_proj) and the MLP hidden units in the order unit_perm (rows of c_fc, its bias, columns of
    mlp.c_proj). Position p takes the old head (unit) perm[p]. GPT's function, and every all-'tp'
    DistributedGPT's, is unchanged; shard d of an 'spd' block then holds heads perm[d*H/tp : (d+1)*H/tp]."""
    out = dict(state_dict)
    for i, (head_perm, unit_perm) in perms.items():
        p = f"transformer.h.{i}."
        if head_perm is not None:
            C = state_dict[p + "attn.c_proj.weight"].shape[0]
            hs = C // n_head
            cols = torch.cat([torch.arange(h * hs, (h + 1) * hs) for h in head_perm])  # (C,) channel order
            rows = torch.cat([j * C + cols for j in range(3)])  # q, k, v each by heads
            out[p + "attn.c_attn.weight"] = state_dict[p + "attn.c_attn.weight"][rows]
            if p + "attn.c_attn.bias" in state_dict:
                out[p + "attn.c_attn.bias"] = state_dict[p + "attn.c_attn.bias"][rows]
            out[p + "attn.c_proj.weight"] = state_dict[p + "attn.c_proj.weight"][:, cols]
        if unit_perm is not None:
            units = torch.as_tensor(unit_perm)
            out[p + "mlp.c_fc.weight"] = state_dict[p + "mlp.c_fc.weight"][units]
            if p + "mlp.c_fc.bias" in state_dict:
                out[p + "mlp.c_fc.bias"] = state_dict[p + "mlp.c_fc.bias"][units]
            out[p + "mlp.c_proj.weight"] = state_dict[p + "mlp.c_proj.weight"][:, units]
    return out


@torch.no_grad()
def block_input(gpt, idx, layer):
    """The original model's residual stream entering block `layer`, (B, T, C)."""
    pos = torch.arange(idx.size(1), device=idx.device)
    x = gpt.embed(idx, pos)
    for block in gpt.transformer.h[:layer]:
        x = block(x)
    return x


@torch.no_grad()
def head_statistics(gpt, layer, idx):
    """(attention probabilities (H, B*T*T), each head's output through its columns of c_proj (H, B, T, C)) of
    the original block `layer` on calibration tokens idx."""
    block, H = gpt.transformer.h[layer], gpt.config.n_head
    x = block_input(gpt, idx, layer)
    B, T, C = x.shape
    q, k, v = block.attn.c_attn(block.ln_1(x)).split(C, dim=2)
    q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hs)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
    att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=x.device).tril(),
                          float("-inf")).softmax(-1)
    y = att @ v  # (B, H, T, hs)
    W = block.attn.c_proj.weight.view(C, H, C // H)  # columns by head
    contrib = torch.einsum("bhtd,chd->hbtc", y, W)  # (H, B, T, C)
    return att.transpose(0, 1).reshape(H, -1), contrib, x


def group_heads(similarity, tp_size):
    """Heads into tp_size groups of equal size, minimising the summed similarity of heads within a
    group (so each device's heads differ most): contiguous start, then best pairwise swaps until
    none helps. Returns the groups."""
    H = similarity.shape[0]
    g = H // tp_size
    groups = [list(range(d * g, (d + 1) * g)) for d in range(tp_size)]
    if g == 1:
        return groups  # one head a device: nothing to choose

    def cost(members):
        return sum(similarity[a, b].item() for ai, a in enumerate(members) for b in members[ai + 1:])

    while True:
        best, move = 0.0, None
        for p in range(tp_size):
            for q in range(p + 1, tp_size):
                now = cost(groups[p]) + cost(groups[q])
                for ai, a in enumerate(groups[p]):
                    for bi, b in enumerate(groups[q]):
                        P = groups[p][:ai] + [b] + groups[p][ai + 1:]
                        Q = groups[q][:bi] + [a] + groups[q][bi + 1:]
                        gain = now - cost(P) - cost(Q)
                        if gain > best + 1e-12:
                            best, move = gain, (p, q, P, Q)
        if move is None:
            return groups
        p, q, P, Q = move
        groups[p], groups[q] = P, Q


@torch.no_grad()
def assign_units(gpt, layer, groups, contrib, x):
    """MLP hidden units onto devices, 4C/tp each: unit j goes where its output, read from that
    device's unsynced stream (x + its heads' attention + b_A, as an 'spd' block computes it), is
    closest to the synced model's: cost[j, d] = mean((gelu_j(LN2(y_d)) - gelu_j(LN2(x')))^2) *
    |W_M[:, j]|^2, assigned greedily by regret."""
    block = gpt.transformer.h[layer]
    b_A = block.attn.c_proj.bias if block.attn.c_proj.bias is not None else 0.0
    synced = x + contrib.sum(0) + b_A  # x' (B, T, C)

    def units(stream):
        return F.gelu(block.mlp.c_fc(block.ln_2(stream)), approximate=gpt.config.gelu_approximate)

    ref = units(synced)  # (B, T, 4C)
    col_norm = block.mlp.c_proj.weight.pow(2).sum(0)  # (4C,)
    cost = torch.stack([((units(x + contrib[g].sum(0) + b_A) - ref) ** 2).mean((0, 1)) * col_norm
                        for g in groups], dim=1)  # (4C, tp)
    n_units, tp = cost.shape
    room = [n_units // tp] * tp
    top2 = cost.topk(2, dim=1, largest=False).values
    chosen = [[] for _ in range(tp)]
    # the units that care most first
    for j in torch.argsort(top2[:, 1] - top2[:, 0], descending=True).tolist():
        for d in torch.argsort(cost[j]).tolist():
            if room[d]:
                chosen[d].append(j)
                room[d] -= 1
                break
    return [j for d in range(tp) for j in sorted(chosen[d])]


def head_grouping(gpt, layer, tp_size, idx):
    """(head_perm, unit_perm) of the paper's head grouping for block `layer`, from calibration
    tokens idx: heads are grouped so that each device's heads differ most, 'differ' measured by the
    cosine similarity of their attention probabilities on the calibration tokens; MLP units then
    follow the head groups (assign_units)."""
    att, contrib, x = head_statistics(gpt, layer, idx)
    att = F.normalize(att, dim=1)
    groups = group_heads(att @ att.T, tp_size)
    head_perm = [h for g in groups for h in g]
    return head_perm, assign_units(gpt, layer, groups, contrib, x)
