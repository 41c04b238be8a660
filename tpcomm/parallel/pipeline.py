"""
Pipeline parallelism (pp) for GPT and DistributedGPT with torch.distributed.pipelining: contiguous layers per
stage, scheduled by torch's ScheduleGPipe, Schedule1F1B or ScheduleInterleaved1F1B (virtual stages), over a
3-D process mesh (pp, dp, tp): pp outermost, tp innermost (a tp group is the ranks of one node).

    stage 0:     idx (b, T)            -> wte + wpe, blocks [0, n0)            -> stream
    stage s:     stream                -> blocks [n_s, n_s+1)                  -> stream
    last stage:  stream                -> blocks, final sync if desynced, ln_f, lm_head -> logits (b, T, V)

The stream crossing a cut is what DistributedGPT's blocks pass each other (docs/model.md): synced, xbar (b, T,
C); desynced (the block before the cut is 'parallel'), the pair (xbar, r), r (L, b, T, C) with this rank's L
shard streams (L = 1 real, L = tp simulated): each tp rank sends its own shard streams to the same tp rank of
the next stage. A cut never syncs: that would change the model. GPT's stream is x (b, T, C). A ladder block
leaves its two outputs pending (P_A, P_M, their all-reduces issued); at a cut they are waited for and added as
the next block would add them: into another block type, xbar + P_A + P_M (= what that block's step adds first,
so xbar alone crosses); between two ladder blocks the pair (u, x), u = xbar + P_A (the next ladder's attention
reads it), x = u + P_M (its MLP reads it and it is the block's output stream): one (b, T, C) more than a
synced cut (docs/pipeline.md).

Exactness (pp == one process): the loss is cross-entropy (ignore_index=-1) averaged over each micro-batch, and
the schedule divides the summed gradients by the number of micro-batches m (torch 2.13: scale_grads=True, the
default, calls stage.scale_grads(m) after the last backward), so the gradient is that of the mean of the
micro-batch means: the whole batch's mean loss when every micro-batch has the same number of targets (as
train.py's data has). DDP over dp then averages over replicas. The tied wte/lm_head weight lives on the first
stage (wte) and the last (lm_head): its two gradients are summed over the {first, last} pp ranks of each (dp,
tp) coordinate (Megatron's embedding group), so both copies take the same AdamW steps and stay equal.

Every rank builds the whole model on the CPU (so the GPT-2 init is the full model's, whatever the layout) and
moves only its stages' parts to its device (Pipeline); the rest stays in host memory, unused. Checkpoint
gathers move tensors by broadcasts over pp (GPTLayout.gather), never as pickles. The stream crosses a cut in
its own dtype, fp32 under bf16 autocast as well: rounding it there would make the model depend on where the
cuts are (docs/pipeline.md, "Precision at the cuts").

This module is the library (stages, the Pipeline runner that train.py uses; the layout checks, run before
torch's pipelining is imported, are in tpcomm/parallel/pipeline_config.py; the recorded schedule and its
replay are in tpcomm/parallel/pipeline_timeline.py); the benchmark of bench.py --mode=pipeline and the demo
are in tpcomm/bench/pipeline_demo.py:
    torchrun --standalone --nproc_per_node=8 \
        -m tpcomm.bench.pipeline_demo --tp_size=2 --pp_size=4 --schedule=1f1b
"""

import contextlib
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.nn import functional as F

from model import GPT, configure_adamw, positions
from tpcomm.model.block_types.registry import BLOCK_TYPES
from tpcomm.model.interface import clip_to_norm_
from tpcomm.parallel.pipeline_config import SCHEDULE_NAMES, stage_layers
from tpcomm.parallel.pipeline_layout import GPTLayout, stage_named_parameters
from tpcomm.parallel.pipeline_timeline import Recorder, RecordedStage
from tpcomm.tp.sharded_layers import add_pending

SCHEDULES = dict(zip(SCHEDULE_NAMES, (ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B)))


# ---------------------------------------------------------------- one stage: the model's own submodules

# What crosses a cut, by the blocks on either side: the names of its tensors (every one (b, T, C), r (L, b, T,
# C))
SYNCED, DESYNCED, LADDER = ("xbar",), ("xbar", "r"), ("u", "x")


def cut_stream(model, layer):
    """The stream crossing a cut after block `layer`: DESYNCED after a block that desyncs ('parallel'), LADDER
    between two blocks that delay ('ladder': their pending outputs travel as u = xbar + P_A and x = u + P_M),
    else SYNCED (GPT's x too)."""
    kinds = getattr(model.config, "block_types", None)
    if model.desynced_after(layer):
        return DESYNCED
    if kinds is not None and BLOCK_TYPES[kinds[layer]].delays and BLOCK_TYPES[kinds[layer + 1]].delays:
        return LADDER
    return SYNCED


class Arrived(NamedTuple):
    """MLP l-1's pending output as it crosses a ladder cut: already added on the previous stage, x =
    u + P_M (the same operations the next ladder block would run), so adding it gives x. Takes
    Pending's place in (P_A, P_M)."""
    x: torch.Tensor  # (N, C)

    def add_to(self, u):
        return self.x


class StageModule(nn.Module):
    """Layers [first, end) of a GPT or DistributedGPT, with the embedding on the first stage and the final
    sync, ln_f and lm_head on the last. It holds the model's own submodules (no copies), under GPT's names
    with stage-local block indices (gpt_name maps them back), so GPT.embed runs on it as on the model.
    stream_in / stream_out: what crosses the cut before / after it (cut_stream; None at the ends)."""

    def __init__(self, model, first, end, *, is_first, is_last):
        super().__init__()
        self.config, self.first = model.config, first
        self.is_first, self.is_last = is_first, is_last
        self.stream_in = None if is_first else cut_stream(model, first - 1)
        self.stream_out = None if is_last else cut_stream(model, end - 1)
        self.group = model.group  # DistributedGPT's tp group (SimulatedTP/RealTP); None for GPT
        # DistributedGPT's sync before ln_f
        self.final_sync = model.final_sync if model.group is not None else None
        parts = dict(h=nn.ModuleList(model.transformer.h[first:end]))
        if is_first:
            parts.update(wte=model.transformer.wte, wpe=model.transformer.wpe, drop=model.transformer.drop)
        if is_last:
            parts.update(ln_f=model.transformer.ln_f)
            self.lm_head = model.lm_head  # on a stage without wte this is the tied weight's second copy
        self.transformer = nn.ModuleDict(parts)

    def gpt_name(self, name):
        if name.startswith("transformer.h."):
            i, rest = name[len("transformer.h."):].split(".", 1)
            return f"transformer.h.{self.first + int(i)}.{rest}"
        return name

    def forward(self, *stream):
        """idx (b, T) on the first stage, else the stream (stream_in): x (b, T, C) for GPT, xbar (b, T, C)
        [, r (L, b, T, C)], or u, x (b, T, C)."""
        if self.is_first:
            idx, = stream
            stream = (GPT.embed(self, idx, positions(idx, self.config.block_size)),)  # (b, T, C), synced
        b, t, C = stream[0].shape
        if self.group is None:  # GPT
            x = stream[0]
            for block in self.transformer.h:
                x = block(x)
        # the blocks' stream is flat over tokens: (xbar, r, pending), as DistributedGPT.forward passes it
        else:
            xbar, r, pending = self.enter(stream)
            blocks = self.transformer.h
            # the stage's last block has no next one here (the cut is between)
            for i, block in enumerate(blocks):
                nxt = blocks[i + 1] if i + 1 < len(blocks) else None
                xbar, r, pending = block.step(xbar, r, pending, t, next_block=nxt)
            if not self.is_last:
                return tuple(s.view(-1, b, t, C) if s.dim() == 3 else s.view(b, t, C)
                             for s in self.leave(xbar, r, pending))
            x = self.final_sync(xbar, r, pending).view(b, t, C)
        if not self.is_last:
            return x
        return self.lm_head(self.transformer.ln_f(x))  # (b, T, V)

    def enter(self, stream):
        """The received stream as the blocks' (xbar (N, C), r (L, N, C) or None, pending)."""
        b, t, C = stream[0].shape
        flat = [s.reshape(-1, b * t, C) if s.dim() == 4 else s.reshape(b * t, C) for s in stream]
        if self.stream_in == LADDER:  # u, x: the next ladder block reads u, then "adds" MLP l-1's output: x
            u, x = flat
            return u, None, (None, Arrived(x))
        return flat[0], (flat[1] if len(flat) == 2 else None), ()

    def leave(self, xbar, r, pending):
        """The stream to send (stream_out), flat: pending ladder outputs waited for and added
        where the next block would add them (xbar + P_A + P_M into another block type; u = xbar
        + P_A, x = u + P_M into a ladder)."""
        if self.stream_out == LADDER:
            P_A, P_M = pending
            u = P_A.add_to(xbar)
            return u, P_M.add_to(u)
        xbar = add_pending(xbar, pending)
        return (xbar,) if r is None else (xbar, r)


def cross_entropy(logits, targets):
    """The schedule's loss_fn: GPT's loss on one micro-batch (mean over its targets, ignore_index=-1)."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)


# ---------------------------------------------------------------- what the schedule does: recorded

class Pipeline:
    """This rank's stages of `model` (built whole on every rank), their torch PipelineStages and the schedule,
    plus what train.py needs around a step: gradient sync, clipping over the whole model; GPT-layout state
    (GPTLayout) and the communication report (PipelineComm) are delegated."""

    def __init__(self, model, dims, *, schedule, n_microbatches, batch_size, seq_len, virtual_stages=1,
                 pp_layers=None, device="cpu"):
        self.model, self.dims, self.m, self.device = model, dims, n_microbatches, torch.device(device)
        self.n_stages = dims.pp * virtual_stages
        self.layers = stage_layers(model.config.n_layer, self.n_stages, pp_layers)
        self.stage_ids = [dims.pp_rank + v * dims.pp for v in range(virtual_stages)]  # loop: s on s % pp
        self.modules = [StageModule(model, *self.layers[s], is_first=s == 0, is_last=s == self.n_stages - 1)
                        for s in self.stage_ids]
        self.local = nn.ModuleList(self.modules)  # for the optimizer: every local parameter once
        self.local.to(self.device)  # only this rank's stages (the model may be on the CPU, whole)
        self.recorder = Recorder(model)
        self.cut_streams = [cut_stream(model, end - 1) for _, end in self.layers[:-1]]
        mb, dtype = batch_size // n_microbatches, next(model.parameters()).dtype
        stages = [self._stage(s, m, mb, seq_len, dtype) for s, m in zip(self.stage_ids, self.modules)]
        kind = SCHEDULES[schedule]
        self.schedule = (kind(stages, n_microbatches, loss_fn=cross_entropy) if schedule == "interleaved_1f1b"
                         else kind(stages[0], n_microbatches, loss_fn=cross_entropy))
        self.gpt_layout = GPTLayout(model, self.modules, dims)
        self.comm = PipelineComm(model, dims, self.recorder, cut_streams=self.cut_streams, m=n_microbatches,
                                 device=self.device)

    def _stage(self, s, module, mb, T, dtype):
        """Stage s's RecordedStage (DDP over the dp group around its module when dp > 1)."""
        device, last = self.device, s == self.n_stages - 1
        # torch takes requires_grad of the received activations from these examples: without it no gradient
        # would flow back across the cut (the previous stage would receive zeros)
        inputs = (torch.zeros(mb, T, dtype=torch.long, device=device),) if s == 0 else \
            self._stream(s - 1, mb, T, dtype, requires_grad=True)
        V = self.model.config.vocab_size
        outputs = ((torch.empty(mb, T, V, dtype=dtype, device=device),) if last
                   else self._stream(s, mb, T, dtype, requires_grad=True))
        submod = module
        if self.dims.dp > 1:  # DDP over dp per stage; the schedule syncs on each stage's last backward
            submod = nn.parallel.DistributedDataParallel(module, process_group=self.dims.dp_group)
        return RecordedStage(submod, s, self.n_stages, device, recorder=self.recorder,
                             input_args=inputs, output_args=outputs,
                             output_grads=None if last else _detached(outputs),  # the last's: from the loss
                             input_grads=(None,) if s == 0 else _detached(inputs),  # ids: no gradient
                             group=self.dims.pp_group)

    def _stream(self, s, mb, T, dtype, *, requires_grad):
        """Example tensors of the stream leaving stage s (cut_stream): each (mb, T, C), r (L, mb, T, C)."""
        C = self.model.config.n_embd
        shapes = [(self.model.group.local, mb, T, C) if n == "r" else (mb, T, C) for n in self.cut_streams[s]]
        return tuple(torch.empty(shape, dtype=dtype, device=self.device, requires_grad=requires_grad)
                     for shape in shapes)

    @property
    def has_first(self):
        return self.dims.pp_rank == 0

    @property
    def has_last(self):
        return self.dims.pp_rank == self.dims.pp - 1

    # --- the training step ---

    def step(self, micro_batches, *, dropout_key=None, ctx=contextlib.nullcontext()):
        """One forward and backward of this replica's micro-batches [(X, Y)] (each (mb, T)) through the
        schedule, then every gradient sync: each local parameter then holds the gradient one process would
        have for the mean loss over the global batch, returned on every rank. dropout_key: (seed, iteration,
        global index of this replica's first micro-batch), keys the masks as train.py does; ctx: autocast."""
        assert len(micro_batches) == self.m, (len(micro_batches), self.m)
        self.local.zero_grad(set_to_none=True)  # scale_grads divides whatever .grad holds
        self.recorder.start(dropout_key)
        losses = self._through_schedule(self.schedule.step, micro_batches, ctx)
        self.sync_grads()
        return self._dp_mean(losses.mean())

    def pipelined_step(self, micro_batches, optimizer, *, dropout_key, ctx, grad_clip, tokens):
        """train.py's step under pp: step() (the schedule, then every gradient sync), then clip and update as
        one process would. Returns (the mean loss, the collectives report of the step)."""
        self.reset_comm_counts()
        lossf = self.step(micro_batches, dropout_key=dropout_key, ctx=ctx)
        comm = self.comm_report(tokens=tokens)
        if grad_clip != 0.0:
            self.clip_grad_norm_(grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return lossf, comm

    @torch.no_grad()
    def eval_loss_sum(self, batches, *, counted, ctx=contextlib.nullcontext()):
        """[sum, count] of the losses of the batches whose `counted` is True, m at a time through the schedule
        (whole rounds of m: the uncounted batches are repeats that keep every rank's collectives in step)."""
        per_batch = torch.cat([self.eval_losses(batches[i:i + self.m], ctx=ctx)
                               for i in range(0, len(batches), self.m)])
        weights = torch.tensor(counted, dtype=torch.float64, device=per_batch.device)
        return [(per_batch * weights).sum().item(), int(weights.sum().item())]

    @torch.no_grad()
    def eval_losses(self, micro_batches, *, ctx=contextlib.nullcontext()):
        """The loss of each of this replica's micro-batches (forward only, through the schedule), on every
        rank of the pp group: a float64 tensor (m,). The stages hold the only up-to-date weights of their
        layers: evaluate here, not with the whole model of one rank. Train/eval mode: see train()."""
        self.recorder.start(None)
        return self._through_schedule(self.schedule.eval, micro_batches, ctx)

    def eval_loss(self, micro_batches):
        """The mean of eval_losses, averaged over dp, on every rank."""
        return self._dp_mean(self.eval_losses(micro_batches).mean())

    def _through_schedule(self, run, micro_batches, ctx):
        """schedule.step or schedule.eval over the micro-batches [(X, Y)]; returns the last stage's
        micro-batch losses (float64, (m,)), broadcast over pp."""
        X = torch.cat([x for x, _ in micro_batches])
        Y = torch.cat([y for _, y in micro_batches])
        losses = []
        with ctx:
            run(*((X,) if self.has_first else ()), target=Y if self.has_last else None,
                losses=losses if self.has_last else None, return_outputs=False)
        out = torch.stack(losses).detach().double().to(X.device) if self.has_last else \
            torch.zeros(self.m, dtype=torch.float64, device=X.device)
        if self.dims.pp > 1:
            dist.broadcast(out, group=self.dims.pp_group, group_src=self.dims.pp - 1)
        return out

    def _dp_mean(self, loss):
        """A float64 scalar averaged over the dp replicas, as a float."""
        if self.dims.dp > 1:
            dist.all_reduce(loss, group=self.dims.dp_group)
            loss /= self.dims.dp
        return loss.item()

    def train(self, mode=True):
        """Training or evaluation mode (dropout) for the stages and the model they
        share their modules with."""
        self.model.train(mode)
        self.local.train(mode)
        return self

    def sync_grads(self):
        """After the schedule (which averaged over micro-batches, and over dp through DDP): sum the
        tied embedding's two gradients over the embedding group, and (real tp) replicated ones' over tp."""
        if self.dims.pp > 1:
            tied = (self.modules[0].transformer.wte.weight if self.has_first else
                    self.modules[-1].lm_head.weight if self.has_last else None)
            if tied is not None:
                dist.all_reduce(tied.grad, group=self.dims.embedding_group)
        self.model.sync_replicated_grads()  # GPT and simulated tp: nothing

    # --- the whole model's view of this rank's parameters ---

    @property
    def config(self):
        return self.model.config

    def parameters(self):
        """This rank's parameters (its stages'), each once."""
        return self.local.parameters()

    def named_parameters(self):
        """(GPT name, parameter) of every local parameter, each once (see stage_named_parameters)."""
        return stage_named_parameters(self.modules)

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm):
        """Clip by the norm of the whole model's gradient: the model's own rule on each stage
        (model.grad_sq_norm: tp shards summed, replicated parameters counted once), the tied weight once (its
        first-stage copy), summed over the pp stages. Returns that norm."""
        grads = [(n, p.grad) for n, p in self.named_parameters() if p.grad is not None]
        total = self.model.grad_sq_norm([(n, g) for n, g in grads if n != "transformer.wte.weight"
                                         or self.has_first])
        if self.dims.pp > 1:
            dist.all_reduce(total, group=self.dims.pp_group)
        return clip_to_norm_([g for _, g in grads], total.sqrt(), max_norm)

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW over this rank's parameters, grouped as GPT.configure_optimizers groups them."""
        return configure_adamw(self.local, weight_decay, learning_rate, betas, device_type)

    # --- GPT-layout state (checkpoints), delegated to GPTLayout ---

    def gpt_state_dict(self):
        return self.gpt_layout.state_dict()

    def gpt_grads(self):
        return self.gpt_layout.grads()

    def load_gpt_state_dict(self, state_dict):
        self.gpt_layout.load_state_dict(state_dict)

    def gpt_optimizer_state(self, optimizer):
        return self.gpt_layout.optimizer_state(optimizer)

    def load_gpt_optimizer_state(self, optimizer, state_dict):
        self.gpt_layout.load_optimizer_state(optimizer, state_dict)

    # --- what crossed the stage boundaries, next to the tp all-reduces, delegated to PipelineComm ---

    def reset_comm_counts(self):
        self.model.reset_comm_counts()

    def comm_report(self, *, tokens):
        return self.comm.report(tokens=tokens)


# ---------------------------------------------------------------- what crossed the cuts, next to the tp
# all-reduces

# the model's per-micro-batch tp counts, summed over the pp stages (each stage counts its own blocks'); a GPT
# communicates nothing in tp: 0 all-reduces (fwd, bwd) and 0 bytes, reported as such, not left out
STAGE_SUMMED = ("fwd_allreduces", "bwd_allreduces", "async_allreduces", "comm_bytes_per_token",
                "vocab_allreduces", "vocab_bytes_per_token")
NO_TP = dict(fwd_allreduces=0, bwd_allreduces=0, comm_bytes_per_token=0.0)


class PipelineComm:
    """The communication of a Pipeline's last step: its recorded point-to-point transfers across the cuts and
    the model's tp collectives, summed over the stages (collectives over pp: every rank calls them). It holds
    what it reads, not the Pipeline: no reference cycle, so a Pipeline is freed (stages, p2p buffers) as soon
    as it is dropped, before the process groups are destroyed."""

    def __init__(self, model, dims, recorder, *, cut_streams, m, device):
        self.model, self.dims, self.recorder = model, dims, recorder
        self.cut_streams, self.m, self.device = cut_streams, m, device

    def gather_events(self):
        """{pp rank: its recorded events of the last step}, on every rank of this pp group (a collective)."""
        events = [None] * self.dims.pp
        if self.dims.pp == 1:
            events = [self.recorder.events]
        else:
            dist.all_gather_object(events, self.recorder.events, group=self.dims.pp_group)
        return dict(enumerate(events))

    def boundary_bytes(self):
        """Per cut s -> s+1, per micro-batch and rank, in the last step: bytes of activations sent forward (by
        s) and of gradients sent back (by s+1), and what the stream was (a small all-reduce over pp)."""
        n = len(self.cut_streams)  # cuts: stages - 1
        sent = torch.zeros(2, max(n, 1), dtype=torch.float64, device=self.device)
        for kind, s, _, nbytes in self.recorder.events:
            if kind in ("send_act", "send_grad"):
                sent[0 if kind == "send_act" else 1, s if kind == "send_act" else s - 1] += nbytes
        if self.dims.pp > 1:
            dist.all_reduce(sent, group=self.dims.pp_group)
        return [dict(cut=f"{s}->{s + 1}", stream=", ".join(self.cut_streams[s]),
                     fwd_bytes=int(sent[0, s]) // self.m, bwd_bytes=int(sent[1, s]) // self.m)
                for s in range(n)]

    def report(self, *, tokens):
        """The model's comm_report with the tp counts (STAGE_SUMMED) summed over the pp stages, per
        micro-batch of `tokens` tokens (the schedule's m per step), plus the pp boundaries' bytes per
        micro-batch and rank, and per token. comm_seconds, grad_sync_allreduces: this rank's."""
        report = self.model.comm_report(micro_steps=1, tokens=tokens) or dict(NO_TP)
        # every key on every stage (a stage without vocab collectives has no vocab keys): one tensor shape
        # over pp
        counts = torch.tensor([float(report.get(k, 0)) for k in STAGE_SUMMED], dtype=torch.float64,
                              device=self.device)
        if self.dims.pp > 1:
            dist.all_reduce(counts, group=self.dims.pp_group)
        for k, v in zip(STAGE_SUMMED, counts.tolist()):
            if k in report or v:
                report[k] = int(v) // self.m if k.endswith("allreduces") else v / self.m
        cuts = self.boundary_bytes()
        report["pp_boundaries"] = cuts
        report["pp_bytes_per_token"] = sum(c["fwd_bytes"] + c["bwd_bytes"] for c in cuts) / tokens
        return report


def _detached(examples):
    """Example gradients: the examples' shapes without requires_grad."""
    return tuple(a.detach() for a in examples)


def build_pipeline(model, dims, **kwargs):
    """This rank's Pipeline of a whole model built on every rank (see Pipeline for the keyword arguments)."""
    return Pipeline(model, dims, **kwargs)
