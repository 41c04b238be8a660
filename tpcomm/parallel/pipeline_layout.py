"""
A pipeline's parameters in GPT's layout (tpcomm/parallel/pipeline.py): each rank holds its stages'
slices; GPTLayout gathers them (state dict, gradients, optimizer state) over the pp ranks and loads a
GPT-layout state back into them.
"""

import math

import torch
import torch.distributed as dist



def stage_named_parameters(modules):
    """(GPT name, parameter) of every parameter of the stage modules, each once; the last stage's copy of the
    tied weight is named transformer.wte.weight as GPT's named_parameters() names it."""
    seen, out = set(), []
    for module in modules:
        for name, p in module.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                name = module.gpt_name(name)
                out.append(("transformer.wte.weight" if name == "lm_head.weight" else name, p))
    return out


class GPTLayout:
    """The whole model's GPT-layout state (weights, gradients, AdamW state) gathered from every stage (and tp
    rank) of a pipeline, so checkpoints stay unsharded GPT layout; and the inverse for the optimizer state.
    Each gather is a collective over tp and pp: every rank calls it."""

    def __init__(self, model, modules, dims):
        self.model, self.modules, self.dims = model, modules, dims

    def gather(self, local, name=lambda key: key):
        """{key: this rank's tensor} -> the whole model's {key: tensor} on every rank: tensors of sharded
        parameters (name(key) is the parameter's GPT name) gathered over tp, then every pp stage's
        entries, on the CPU (collectives over tp and pp; dp replicas hold the same). The first pp rank's
        entry wins: its copy of the tied weight."""
        sharding = self.model.sharding
        if sharding is not None:
            local = {k: sharding.gather(name(k), t) if t.dim() > 0 else t for k, t in local.items()}
        if self.dims.pp == 1:
            return local
        return self._gather_over_pp(local)

    def _gather_over_pp(self, local):
        """Every pp rank's entries on every rank (CPU tensors), by tensor collectives: only the keys, shapes
        and dtypes go round as objects; then each pp rank broadcasts the entries it is the first to hold,
        flattened into one buffer per dtype, on the process group's device (NCCL: this rank's GPU), at most
        one such buffer on the device at a time."""
        group, pp, me = self.dims.pp_group, self.dims.pp, self.dims.pp_rank
        device = (torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl"
                  else torch.device("cpu"))
        held = [None] * pp
        dist.all_gather_object(held, [(k, tuple(t.shape), str(t.dtype).removeprefix("torch."))
                                      for k, t in local.items()], group=group)
        owner = {}  # key -> (first pp rank holding it, shape, dtype), in the order the ranks list them
        for r, entries in enumerate(held):
            for k, shape, dtype in entries:
                owner.setdefault(k, (r, shape, dtype))
        merged = {}
        for r in range(pp):
            for dtype in sorted({d for o, _, d in owner.values() if o == r}):
                keys = [(k, shape) for k, (o, shape, d) in owner.items() if o == r and d == dtype]
                sizes = [math.prod(shape) for _, shape in keys]
                if r == me:
                    flat = torch.cat([local[k].detach().reshape(-1).to(device) for k, _ in keys])
                else:
                    flat = torch.empty(sum(sizes), dtype=getattr(torch, dtype), device=device)
                dist.broadcast(flat, group=group, group_src=r)
                for (k, shape), part in zip(keys, flat.cpu().split(sizes)):
                    merged[k] = part.view(shape).clone()
        return {k: merged[k] for k in owner}

    def local_named(self, value):
        """{GPT name: value(p)} for every local (name, parameter), the tied weight
        under both of GPT's names."""
        out = {}
        for module in self.modules:
            for name, p in module.named_parameters(remove_duplicate=False):
                out[module.gpt_name(name)] = value(p)
        return out

    def state_dict(self):
        """GPT's state dict of the whole model (both tied names), on every rank."""
        full = self.gather(self.local_named(lambda p: p.detach()))
        return {k: full[k] for k in self.model.state_dict()}  # GPT's key order

    def grads(self):
        """The whole model's gradients by GPT name (both tied names; the last stage's
        copy under lm_head.weight)."""
        return self.gather(self.local_named(lambda p: p.grad))

    def load_state_dict(self, state_dict):
        """The stages hold the model's own parameters: loading the model loads them."""
        self.model.load_gpt_state_dict(state_dict)

    def _gpt_param_order(self):
        """GPT names in the order of GPT.configure_optimizers' parameter indices (decayed >= 2-D first)."""
        named = list(self.model.named_parameters())
        return [n for n, p in named if p.dim() >= 2] + [n for n, p in named if p.dim() < 2]

    def _local_param_names(self, optimizer):
        names = {id(p): n for n, p in stage_named_parameters(self.modules)}
        return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]

    def optimizer_state(self, optimizer):
        """The optimizer state dict GPT's own optimizer would have (unsharded moments,
        GPT's parameter indices)."""
        sd, names = optimizer.state_dict(), self._local_param_names(optimizer)
        local = {(names[i], k): v for i, s in sd["state"].items() for k, v in s.items()}
        full = self.gather(local, name=lambda key: key[0])  # moments are sharded like their parameters
        order = self._gpt_param_order()
        state = {}
        for i, name in enumerate(order):
            entry = {k: v for (n, k), v in full.items() if n == name}
            if entry:
                state[i] = entry
        n_decay = sum(p.dim() >= 2 for _, p in self.model.named_parameters())
        groups = [dict(g, params=list(range(n_decay)) if j == 0 else list(range(n_decay, len(order))))
                  for j, g in enumerate(sd["param_groups"])]
        return {"state": state, "param_groups": groups}

    def load_optimizer_state(self, optimizer, state_dict):
        """Inverse of optimizer_state: each local parameter takes its GPT entry
        (its tp slice of the moments)."""
        index = {n: i for i, n in enumerate(self._gpt_param_order())}
        sharding = self.model.sharding
        local = {}
        for j, name in enumerate(self._local_param_names(optimizer)):
            entry = state_dict["state"].get(index[name])
            if entry is not None:
                local[j] = {k: sharding.shard(name, v) if sharding is not None and v.dim() > 0 else v
                            for k, v in entry.items()}
        groups = optimizer.state_dict()["param_groups"]
        for g, src in zip(groups, state_dict["param_groups"]):
            g.update({k: v for k, v in src.items() if k != "params"})
        optimizer.load_state_dict({"state": local, "param_groups": groups})
