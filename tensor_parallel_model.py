"""
DistributedGPT: GPT-2 whose blocks are, per layer, one of the block types of tpcomm/model/block_types/:
Megatron tensor-parallel ('tp', 2 forward all-reduces), Sync-Point Drop ('spd', 1), fully 'parallel' (0),
Ladder Residual ('ladder', 2, delayed) or partial-channel sync ('caat', 2 of a fraction of the channels).
docs/model.md has the equations, the sharding and the dropout rules; this file is the model around the blocks:
embedding, the stream's final sync, the (vocabulary-parallel) head and loss, and GPT-layout state in and out.

Shard-side tensors lead with a shard dimension L: tp when simulated (one process holds every shard), 1 in real
mode. In the blocks the stream is flat over tokens: synced (N, C), per shard (L, N, C), N = B*T (no view
between a tensor and its uses, so autograd accumulates a stream's two gradients in place). Parameters keep
GPT's names and, simulated, shapes (a GPT state dict loads as it is; real mode: tpcomm/tp/sharding.py). All
communication goes through f and g (counted).
"""
import torch
import torch.nn as nn

from tpcomm.errors import ConfigError
from model import GPT, GPTConfig, LayerNorm, lm_head_and_loss, positions
from tpcomm.tp.dropout import EMBED, DropoutKey, KeyedDropout
from tpcomm.model.interface import ModelInterface, clip_to_norm_, grad_sq_sums, local, whole
from tpcomm.model.blocks import block_class
from tpcomm.model.block_types.registry import BLOCK_TYPES
from tpcomm.tp.sharding import TPSharding, is_block_replicated, padded_vocab
from tpcomm.tp.compress.compression import make_codec
from tpcomm.model.options import TPConfig, private_head, tp_config
from tpcomm.tp.collectives import copy_to_tp_region, keep_dtype, reduce_from_tp_region, tp_group
from tpcomm.tp.counting import FINAL_SYNC, VOCAB_EMBED, VOCAB_HEAD
from tpcomm.tp.sequence_parallel import (gather_from_sequence_region, reduce_scatter_from_tp_region,
                                         scatter_to_sequence_region)
from tpcomm.tp.vocab_parallel import vocab_parallel_cross_entropy
from tpcomm.tp.sharded_layers import add_pending

SP_EMBED = (None, None, "sp_embed")  # trace site: the embedding output scattered onto the token shards


def fork_init_rng():
    """torch.random.fork_rng over the generators a module's default init draws from: the CPU's and, where
    modules are built on an accelerator (`with torch.device('cuda'):`), that device's. Without the
    device's, a DistributedGPT built there advanced the CUDA generator before GPT's init drew from it:
    weights unlike GPT's for the same seed."""
    dev = torch.get_default_device()
    accel = dev.type not in ("cpu", "meta")
    return torch.random.fork_rng(devices=[dev] if accel else [], device_type=dev.type if accel else "cuda")


class DistributedGPT(ModelInterface, GPT):
    """GPT with tensor-parallel blocks. `pd` (parallel.ParallelDims) with pd.tp > 1 selects real mode: this
    rank holds the shards of its tp rank and f/g all-reduce over the tp group."""

    def __init__(self, config, *, pd=None, init=True):
        """init=False leaves the weights to materialize_ (built under torch.device('meta'))."""
        nn.Module.__init__(self)
        assert isinstance(config, TPConfig)
        if pd is not None and pd.tp > 1 and pd.tp != config.tp_size:
            raise ConfigError(f"tp_mode='real' runs {pd.tp} tp ranks but tp_size is {config.tp_size}")
        # the last block hands the head each shard's own stream (no final sync): caat as its authors run it
        self.private_head = private_head(config.block_types, config.tp_size)
        # wte/lm_head split by vocabulary: loss_parallel, or real TP under a private head (each rank's slice)
        self.vocab_parallel = config.loss_parallel or (self.private_head and pd is not None and pd.tp > 1)
        self.config = config
        codec = make_codec(config.tp_comm_dtype, config.tp_comm_block, config.tp_comm_exchange)  # None: plain
        self.group = tp_group(config.tp_size, pd, codec=codec)
        self.sharding = TPSharding(n_embd=config.n_embd, tp=config.tp_size, group=self.group,
                                   vocab_size=config.vocab_size, vocab_parallel=self.vocab_parallel)
        # rows of the tied wte/lm_head held here: all, or (loss_parallel) the local shards' padded share
        V_local = (self.sharding.V_pad // config.tp_size * self.group.local if self.vocab_parallel
                   else config.vocab_size)
        self.devices_per_replica = config.tp_size if self.group.real else 1
        self.dropout_key = DropoutKey()
        # the default init (overwritten below) draws from a forked RNG: GPT's draws from the caller's seed
        with fork_init_rng():
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(V_local, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=KeyedDropout(config.dropout, self.dropout_key, layer=-1, site=EMBED),  # replica mask
                h=nn.ModuleList([block_class(kind)(config, self.group, self.dropout_key, i)
                                 for i, kind in enumerate(config.block_types)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            ))
            self.lm_head = nn.Linear(config.n_embd, V_local, bias=False)
            self.transformer.wte.weight = self.lm_head.weight
        if init:  # GPT-2 init on the full matrices (GPT's own init, same random stream), then sharded
            self.load_gpt_state_dict(GPT(self.gpt_config()).state_dict())

    def gpt_config(self):
        return GPTConfig(**{k: getattr(self.config, k) for k in GPTConfig.__dataclass_fields__})

    @classmethod
    def from_gpt(cls, gpt, tp_size, block_types=None, *, pd=None, loss_parallel=False, **options):
        """options: TP_COMM_OPTIONS (tp_overlap, ...) and block types' options by key (caat_sync_fraction)."""
        config = tp_config(**{k: getattr(gpt.config, k) for k in GPTConfig.__dataclass_fields__},
                           tp_size=tp_size, block_types=block_types, loss_parallel=loss_parallel, **options)
        model = cls(config, pd=pd)
        model.load_gpt_state_dict(gpt.state_dict())
        return model

    def to_gpt(self):
        gpt = GPT(self.gpt_config())
        gpt.load_state_dict(self.gpt_state_dict())
        return gpt

    def forward(self, idx, targets=None, *, kv_cache=None):
        """Logits and loss; with a KVCache, idx holds only the tokens after those already cached."""
        b, t = idx.size()
        x = self.embed(idx, positions(idx, self.config.block_size, kv_cache))  # (b, t, C)
        # the blocks' stream, flat over tokens: synced xbar, desynced r, ladder outputs still pending
        xbar, r, pending = x.view(b * t, -1), None, ()
        sequence_parallel = self.sequence_parallel_on(b * t)
        if sequence_parallel:  # the synced stream sharded along the tokens (docs/overlap.md)
            xbar = scatter_to_sequence_region(xbar, self.group, site=SP_EMBED)
        blocks = self.transformer.h
        for i, block in enumerate(blocks):
            xbar, r, pending = block.step(xbar, r, pending, t, None if kv_cache is None
                                          else kv_cache.layers[i], sequence_parallel=sequence_parallel,
                                          next_block=blocks[i + 1] if i + 1 < len(blocks) else None)
        if kv_cache is not None:
            kv_cache.advance(t)
        if self.private_head:  # no final sync: each shard's ln_f and head slice on its own stream
            h = self.transformer.ln_f(r)  # (L, N, C)
            return self.vocab_parallel_head(h.view(h.shape[0], b, t, -1), targets, private=True)
        x = self.final_sync(xbar, r, pending, sequence_parallel=sequence_parallel)
        x = self.transformer.ln_f(x.view(b, t, -1))
        if self.vocab_parallel:
            return self.vocab_parallel_head(x, targets)
        return lm_head_and_loss(self.lm_head, x, targets)

    def desynced_after(self, layer):
        return BLOCK_TYPES[self.config.block_types[layer]].desyncs

    def sequence_parallel_on(self, n):
        """Whether a pass of n tokens runs sequence parallel: sequence_parallel at tp >= 2, when the n tokens
        split into tp token shards; in training they must (an error naming the values), else (generation, a KV
        cache's one-token steps) the pass runs without it, computing the same function."""
        tp = self.group.tp
        if not (self.config.sequence_parallel and tp > 1):
            return False
        if n % tp and self.training:
            raise ConfigError(f"sequence_parallel=True needs the batch's tokens (batch_size x block_size = "
                              f"{n}) divisible by tp_size ({tp})")
        return n % tp == 0

    def final_sync(self, xbar, r, pending=(), *, sequence_parallel=False):
        """The stream before ln_f: xbar plus what a last ladder block left pending, or, after a desyncing
        last block, one more sync xbar + sum_i d_i. sequence_parallel: xbar is a token shard, all-gathered;
        a desynced xbar (an SPStream) first gets its d_i = r_i - base reduce-scattered onto the shard."""
        xbar = add_pending(xbar, pending)
        if sequence_parallel:
            if r is not None:
                xbar = xbar.shard + reduce_scatter_from_tp_region(xbar.delta(r), self.group, site=FINAL_SYNC)
            return gather_from_sequence_region(xbar, self.group, site=FINAL_SYNC)
        return xbar if r is None else xbar + reduce_from_tp_region(self.group.delta(r, xbar), self.group,
                                                                   site=FINAL_SYNC)

    # --- loss_parallel: the tied wte/lm_head split by vocabulary over the tp shards ---

    def vocab_rows(self):
        """(L, Vs, C) the local shards' rows of the tied weight, and (L, 1) each one's first vocabulary id.
        Without vocab_parallel (simulated only: a private head) the whole weight is padded and split here."""
        W, tp, L = self.lm_head.weight, self.config.tp_size, self.group.local
        if not self.vocab_parallel:
            W = torch.cat([W, W.new_zeros(padded_vocab(self.config.vocab_size, tp) - W.shape[0], W.shape[1])])
        Vs = W.shape[0] // L
        first = torch.arange(self.group.first_shard, self.group.first_shard + L, device=W.device)
        return W.view(L, Vs, -1), (first * Vs).unsqueeze(1)

    def embed(self, idx, pos):
        if not self.vocab_parallel:
            return super().embed(idx, pos)
        # each shard looks up the ids it holds (zeros for the others), one all-reduce sums them (Megatron's
        # VocabParallelEmbedding); counted with the vocab-parallel collectives
        W, start = self.vocab_rows()
        ids = idx.reshape(1, -1) - start  # (L, N)
        mine = (ids >= 0) & (ids < W.size(1))
        rows = ids.clamp(0, W.size(1) - 1) + torch.arange(W.size(0), device=idx.device)[:, None] * W.size(1)
        parts = W.reshape(-1, W.size(-1))[rows] * mine.unsqueeze(-1)  # (L, N, C)
        with keep_dtype(parts):  # the embedding enters the stream unrounded under bf16 autocast, as GPT's
            x = reduce_from_tp_region(parts, self.group, vocab=True, site=VOCAB_EMBED).view(*idx.shape, -1)
        return self.transformer.drop(x + self.transformer.wpe(pos))

    def vocab_parallel_head(self, x, targets, *, private=False):
        """Logits of the local vocabulary shards and the loss from them; without targets (generation), the
        last position's logits gathered over the shards, padding removed. x: the synced (b, t, C), or
        (private) each shard's own (L, b, t, C)."""
        W, start = self.vocab_rows()
        b, t, C = x.shape[-3:]
        if targets is None:
            x = x[..., [-1], :]
        h = (x.reshape(x.shape[0], -1, C) if private  # (L, N, C)
             else copy_to_tp_region(x.reshape(-1, C), self.group, vocab=True, site=VOCAB_HEAD))
        logits = torch.bmm(h, W.transpose(1, 2))  # (L, N, Vs)
        col = start + torch.arange(W.size(1), device=x.device)  # (L, Vs) vocabulary id of each column
        logits = logits.masked_fill((col >= self.config.vocab_size).unsqueeze(1), float("-inf"))
        if targets is None:
            full = self.group.gather_shards(logits)[..., :self.config.vocab_size]
            return full.view(b, 1, -1), None
        loss = vocab_parallel_cross_entropy(logits, targets.reshape(-1), self.group, start)
        return logits, loss

    def gathered_logits(self, logits, shape):
        """GPT's (B, T, V) logits from a forward with targets (shape: (B, T)): a vocabulary-parallel head's
        (L, N, V'/tp) slices side by side, padding removed (an all-gather in real mode); GPT's as they are."""
        if not (self.vocab_parallel or self.private_head):
            return logits
        return self.group.gather_shards(logits)[..., :self.config.vocab_size].view(*shape, -1)

    # --- the model interface (see GPT): GPT-layout state in and out, whatever this rank holds ---

    def gpt_layout_part(self, name, full):
        return self.sharding.shard(name, full)

    def gpt_layout_whole(self, name, part):
        return self.sharding.gather(name, whole(part))

    def sync_replicated_grads(self):
        """Real mode: the block-replicated parameters' gradients summed over the tp group (one all-reduce)."""
        def replicated(n):  # ln_f too when each shard applies it to its own stream
            return is_block_replicated(n) or (self.private_head and n.startswith("transformer.ln_f."))
        self.group.sync_replicated_grads(
            [local(p.grad) for n, p in self.named_parameters() if replicated(n) and p.grad is not None])

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm):
        """Clip by the norm of the whole (unsharded) model's gradient (see grad_sq_norm)."""
        if not self.group.real:
            return super().clip_grad_norm_(max_norm)
        grads = [(n, p.grad) for n, p in self.named_parameters() if p.grad is not None]
        return clip_to_norm_([g for _, g in grads], self.grad_sq_norm(grads).sqrt(), max_norm)

    def grad_sq_norm(self, named_grads):
        """Real TP: the squares of tp-sharded parameters' gradients summed over the tp group, tp-replicated
        ones' counted once; under FSDP both partial sums are first summed over the data-parallel shards."""
        real = self.group.real
        sq = grad_sq_sums(named_grads, lambda n: 0 if real and self.sharding.is_sharded(n) else 1, 2)
        return self.group.sum_over_shards(sq[0]) + sq[1]

    def get_num_params(self, non_embedding=True):
        """Parameter count of the whole (unsharded) model, whatever this rank holds."""
        n = sum(self.sharding.numel_of_full(name, p) for name, p in self.named_parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def reset_comm_counts(self):
        self.group.counter.reset()

    def comm_report(self, *, micro_steps, tokens):
        return self.group.counter.report(micro_steps=micro_steps, tokens=tokens)
