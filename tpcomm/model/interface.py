"""
The model interface: what lets train.py, bench.py, sample.py, the pipeline and the sweeps treat the
reference GPT (model.py) and DistributedGPT (tensor_parallel_model.py) alike, so that no script asks
which model it holds: GPT-layout state and optimizer state in and out (whatever tensor-parallel and FSDP
shards this rank holds), meta materialisation, gradient clipping and the replicated-gradient sync, the
communication report, MFU, keyed dropout.

ModelInterface holds the single-device answers (the plain operations, or nothing to do); DistributedGPT
overrides them. PlainGPT is model.py's GPT with this interface and keyed dropout: what model_type='gpt'
trains. Its parameters and state dict are GPT's, so checkpoints stay nanoGPT's. tpcomm/train/build.py
builds either from a config.
"""

import torch
import torch.nn as nn

from model import GPT, init_gpt2_param_
from tpcomm.tp.dropout import ATTN_OUT, ATTN_PROBS, EMBED, MLP_OUT, DropoutKey, KeyedDropout


def whole(t):
    """A DTensor (e.g. an FSDP-sharded parameter or moment) gathered whole, a
    collective; a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def local(t):
    """This rank's local shard of a DTensor; a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def laid_out_like(full, ref):
    """full distributed as ref is (FSDP: each rank keeps its data-parallel shard); full
    itself when ref is plain."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(ref, DTensor):
        return distribute_tensor(full.to(ref.device), ref.device_mesh, ref.placements)
    return full


class ModelInterface:
    """Mixed into an nn.Module GPT (PlainGPT, DistributedGPT) with `config`, `transformer` and `lm_head`."""

    devices_per_replica = 1
    # the tensor-parallel group (collectives.SimulatedTP / RealTP): DistributedGPT's; GPT has none
    group = None
    sharding = None  # how parameters are split over that group (sharding.TPSharding): none for GPT

    def desynced_after(self, layer):
        """Whether the residual stream leaving block `layer` is desynced (a
        'parallel' block): never for GPT."""
        return False

    def seed_dropout(self, *key):
        """Key the dropout masks of the next forward passes, e.g. (seed, iteration, micro_batch); no key:
        torch's global RNG (see tpcomm.tp.dropout)."""
        self.dropout_key.set(key, self.lm_head.weight.device)

    def estimate_mfu(self, fwdbwd_per_iter, dt, *, device=None, dtype=None):
        """MFU over the peak of all the devices one model replica runs on (real TP: tp of
        them), for the training dtype."""
        return super().estimate_mfu(fwdbwd_per_iter, dt, device=device, n_devices=self.devices_per_replica,
                                    dtype=dtype)

    def gpt_state_dict(self):
        """The weights in GPT's unsharded layout (what checkpoints hold), gathered from wherever
        they are sharded: tensor-parallel shards (DistributedGPT) and FSDP's data-parallel shards
        (DTensors). A collective then."""
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
        """A model built under torch.device('meta') (init_device='meta'), possibly FSDP-sharded already:
        allocate this rank's parameters on device and give them GPT(config)'s initial weights, bitwise, one
        full parameter at a time (each rank keeps its tensor-parallel part, and of that its FSDP shard)."""
        self.to_empty(device=device)
        # to_empty allocates the tied weight twice: tie again
        self.transformer.wte.weight = self.lm_head.weight
        own = dict(self.named_parameters())
        with torch.no_grad():
            for name, full in gpt_init_tensors(self.gpt_config()):
                own[name].copy_(laid_out_like(self.gpt_layout_part(name, full), own[name]))
        return self

    def gpt_config(self):
        return self.config

    def sync_replicated_grads(self):
        """After backward: make the gradients of parameters that several ranks hold
        whole. Nothing to do here."""

    def clip_grad_norm_(self, max_norm):
        """Clip by the norm of the whole model's gradient; returns that norm (torch's
        handles FSDP's DTensors)."""
        return whole(torch.nn.utils.clip_grad_norm_(self.parameters(), max_norm))

    def grad_sq_norm(self, named_grads):
        """The squared norm of these (GPT name, gradient) pairs as a part of the whole model's gradient (what
        clip_grad_norm_ measures), so that pipeline stages holding parts of the model can add theirs."""
        return grad_sq_sums(named_grads, lambda name: 0, 1)[0]

    def reset_comm_counts(self):
        """Start counting collectives afresh (GPT runs none)."""

    def comm_report(self, *, micro_steps, tokens):
        """Collectives counted since reset_comm_counts, per forward/backward pass of `tokens` tokens: a dict
        of metrics (empty for GPT, which communicates nothing)."""
        return {}

    def comm_per_forward(self, idx):
        """The collectives of one forward+backward pass on idx (see comm_report);
        gradients are left cleared."""
        self.reset_comm_counts()
        _, loss = self(idx, idx)
        loss.backward()
        self.zero_grad(set_to_none=True)
        report = self.comm_report(micro_steps=1, tokens=idx.numel())
        self.reset_comm_counts()
        return report


class PlainGPT(ModelInterface, GPT):
    """model.py's GPT with the model interface; its dropout masks are keyed (tpcomm.tp.dropout) by the same
    sites that DistributedGPT uses, so at tp_size 1 every block type draws GPT's masks."""

    def __init__(self, config):
        super().__init__(config)
        self.dropout_key = DropoutKey()
        self.transformer.drop = KeyedDropout(config.dropout, self.dropout_key, layer=-1, site=EMBED)
        for i, block in enumerate(self.transformer.h):
            block.attn.attn_dropout = KeyedDropout(config.dropout, self.dropout_key, layer=i, site=ATTN_PROBS)
            block.attn.resid_dropout = KeyedDropout(config.dropout, self.dropout_key, layer=i, site=ATTN_OUT)
            block.mlp.dropout = KeyedDropout(config.dropout, self.dropout_key, layer=i, site=MLP_OUT)


def gpt_init_tensors(config):
    """GPT(config)'s initial weights one tensor at a time, drawn from torch's RNG exactly as GPT(config) draws
    them, so that a model built on the meta device materialises its own part of each (DistributedGPT: its
    shards) bitwise equal to GPT's, holding at most one full parameter, never the whole model. Yields (name,
    tensor) in named_parameters order; the RNG ends where GPT(config) leaves it."""
    with torch.device("meta"):
        meta = GPT(config)  # shapes only: meta tensors draw nothing from the RNG
    # construction: nn.Linear and nn.Embedding draw their default init, in construction order (= modules()
    # order); GPT's init overwrites them, but the draws move the RNG, so they are replayed on a same-shaped
    # module
    for m in meta.modules():
        if isinstance(m, nn.Linear):
            nn.Linear(m.in_features, m.out_features, bias=m.bias is not None)
        elif isinstance(m, nn.Embedding):
            nn.Embedding(m.num_embeddings, m.embedding_dim)
    for name, p in meta.named_parameters():  # then GPT-2's init, parameter by parameter
        full = torch.empty(p.shape)
        init_gpt2_param_(name, full, config.n_layer)
        yield name, full


def grad_sq_sums(named_grads, part, n_parts):
    """Sums of squares of the local gradients in n_parts parts (part(name) -> index), in fp32 at
    least (float64 kept, as torch's clipping); FSDP's DTensor gradients are summed over their
    data-parallel shards as well (all gradients share one mesh and placement: fully_shard is given
    one mesh for the blocks and the root)."""
    grads = [g for _, g in named_grads]
    acc = torch.promote_types(grads[0].dtype, torch.float32)
    sq = torch.zeros(n_parts, dtype=acc, device=grads[0].device)
    for name, g in named_grads:
        sq[part(name)] += local(g).to(acc).pow(2).sum()
    mesh = getattr(grads[0], "device_mesh", None)
    # over the mesh dims the gradients are sharded on (HSDP: dp_shard; its replicas agree)
    if mesh is not None:
        for dim, placement in enumerate(grads[0].placements):
            if placement.is_shard():
                torch.distributed.all_reduce(sq, group=mesh.get_group(dim))
    return sq


def clip_to_norm_(grads, total, max_norm):
    """Scale the gradients by min(1, max_norm / total) as
    torch.nn.utils.clip_grad_norm_ does; returns total."""
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype))
    return total


def timed_step(run, model, optimizer, ctx, X, Y):
    """One plain training step as the timings run it (bench.py, tpcomm/gpu/gpu_check.py): forward under ctx,
    backward, real TP's replicated-gradient sum, AdamW; returns the loss, detached."""
    with ctx:
        _, loss = run(X, Y)
    loss.backward()
    model.sync_replicated_grads()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()
