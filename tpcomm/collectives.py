"""
Tensor-parallel communication: Megatron-LM's two operators as autograd functions, and the groups they run on.

    copy_to_tp_region     (f)  forward: identity, a replicated (N, C) value fans out to the shards (L, N, C)
                               backward: all-reduce (sum) of the shards' gradients
    reduce_from_tp_region (g)  forward: all-reduce (sum) of the shards' partial results (L, N, C) -> (N, C)
                               backward: identity
    reduce_from_tp_region_async  g issued without waiting: returns an AsyncReduction at once; its wait() gives g's
                               result. Real mode runs the all-reduce in the background meanwhile, so compute that
                               does not need the result overlaps it (the ladder block; overlapped TP)
    sequence parallelism (docs/overlap.md), the synced stream sharded along the tokens:
    gather_to_tp_region           f: all-gather of the token shards (backward: reduce-scatter)
    reduce_scatter_from_tp_region g: reduce-scatter to the token shards (backward: all-gather)
    scatter_to_sequence_region / gather_from_sequence_region: onto the token shards (backward all-gather) / off
                               them (all-gather; backward nothing moves). Counted apart (CommCounter.add_sp).

A group is SimulatedTP (one process holds all tp shards as the leading dimension L = tp of every shard-side
tensor; the all-reduce is a sum over that dimension) or RealTP (each rank holds its own shard, L = 1; the
all-reduce is torch.distributed.all_reduce over the tp process group). The block code is the same for both.
The operators count every collective they run (CommCounter), so communication is measured, not computed.

While a profiler records (torch.profiler; comm_trace.trace_steps), every collective also runs inside a
torch.profiler.record_function span named for a trace (comm_trace.collective_events parses it back):

    allreduce <op> <fwd|bwd>[ L<layer> <block type>] <site> <bytes>B <sim|real>
    e.g.  allreduce g fwd L3 spd mlp 24576B real      allreduce f bwd L0 tp attn 24576B sim

op: f (its backward all-reduce), g (its forward all-reduce), g_async (g issued without waiting: the span covers
the issue; the wait for its result is a span of its own, the same label after 'wait ', e.g.
`wait allreduce g_async fwd L3 ladder attn 24576B real`), max / sum (the vocab-parallel loss, the gradient
syncs). site: attn or mlp inside a block (an 'spd' block's one all-reduce closes its MLP), final_sync (before
ln_f), vocab_embed / vocab_head / vocab_loss (loss_parallel), grad_sync (real mode: the block-replicated
gradients, once per step) and grad_norm (real mode: the clipping norm's scalar). Bytes: the tensor each rank
contributes, as counted. Simulated TP has no real collective, but its sum over the shard dimension is the
all-reduce: it is recorded too (sim). With no profiler recording nothing is formatted (one flag is read).
"""

import contextlib
import time

import torch
import torch.distributed as dist


class CommCounter:
    """Collectives counted by f and g: how many, and their payload (the tensor each rank contributes)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.fwd = self.bwd = self.grad_sync = 0
        self.fwd_bytes = self.bwd_bytes = 0
        self.overlapped = 0  # of the fwd ones: issued asynchronously (reduce_from_tp_region_async)
        self.compressed = self.compressed_bytes = 0  # of the fwd ones: block-quantized (tp_comm_dtype), their bytes
        self.vocab = self.vocab_bytes = 0  # the vocab-parallel embedding and loss, counted apart (loss_parallel)
        # RealTP only. seconds: the EXPOSED communication, wall time the compute thread spends inside collectives
        # (waiting for the other ranks included): a blocking one's call, an asynchronous one's issue plus the time
        # its wait() blocked. busy_seconds: how long the collectives ran, a blocking one's call, an asynchronous
        # one's issue to completion (a callback on its future), compute that overlapped it included
        self.seconds = self.busy_seconds = 0.0
        # what torch.compile'd code counted (see add): fwd, fwd bytes, bwd, bwd bytes, vocab, vocab bytes, async,
        # compressed, compressed bytes
        self.compiled = torch.zeros(9, dtype=torch.int64)
        # sequence parallelism's reduce-scatters and all-gathers, counted apart from the all-reduces (add_sp):
        # [count, bytes] per (direction, kind), kind 'rs' or 'ag'; compiled code counts into compiled_sp
        self.sp = {(d, k): [0, 0] for d in ("fwd", "bwd") for k in ("rs", "ag")}
        self.compiled_sp = torch.zeros(2 * len(self.sp), dtype=torch.int64)

    def add(self, direction, nbytes, *, vocab=False, overlapped=False, compressed=False):
        """Count one collective (overlapped: a forward one issued asynchronously; compressed: a forward one moved
        block-quantized, nbytes its compressed payload, scales included). Inside torch.compile'd code
        Python counts would make dynamo guard on their values (and trace again every step), so there the counts go
        into a tensor that the graph updates in place."""
        if torch.compiler.is_compiling():
            slot = 4 if vocab else 0 if direction == "fwd" else 2
            self.compiled.add_(torch.tensor([1 if i == slot or (i == 6 and overlapped) or (i == 7 and compressed)
                                             else nbytes if i == slot + 1 or (i == 8 and compressed)
                                             else 0 for i in range(9)]))
            return
        if vocab:
            self.vocab, self.vocab_bytes = self.vocab + 1, self.vocab_bytes + nbytes
        elif direction == "fwd":
            self.fwd, self.fwd_bytes = self.fwd + 1, self.fwd_bytes + nbytes
            self.overlapped += overlapped
            if compressed:
                self.compressed, self.compressed_bytes = self.compressed + 1, self.compressed_bytes + nbytes
        else:
            self.bwd, self.bwd_bytes = self.bwd + 1, self.bwd_bytes + nbytes

    def add_sp(self, direction, kind, nbytes):
        """Count one reduce-scatter (kind 'rs') or all-gather ('ag') of sequence parallelism; nbytes: the whole
        (N, C) buffer, a reduce-scatter's input or an all-gather's output (see _count_sp)."""
        if torch.compiler.is_compiling():
            slot = 2 * list(self.sp).index((direction, kind))
            self.compiled_sp.add_(torch.tensor([1 if i == slot else nbytes if i == slot + 1 else 0
                                                for i in range(len(self.compiled_sp))]))
            return
        entry = self.sp[direction, kind]
        entry[0], entry[1] = entry[0] + 1, entry[1] + nbytes

    def sp_report(self, n, tokens):
        """The reduce-scatters and all-gathers per pass ({} when there were none), keyed apart from all-reduces."""
        c = self.compiled_sp.tolist()
        counts = {dk: (v[0] + c[2 * i], v[1] + c[2 * i + 1]) for i, (dk, v) in enumerate(self.sp.items())}
        if not any(count for count, _ in counts.values()):
            return {}
        names = dict(rs="reduce_scatters", ag="all_gathers")
        out = {f"{d}_{names[k]}": count // n for (d, k), (count, _) in counts.items()}
        out["sp_bytes_per_token"] = sum(nbytes for _, nbytes in counts.values()) / (n * tokens)
        return out

    def report(self, *, micro_steps, tokens):
        """Per forward/backward pass (one micro-batch of `tokens` tokens); gradient syncs per optimizer step. The
        residual-stream syncs (fwd/bwd_allreduces) never include the vocab-parallel collectives, reported apart.
        async_allreduces: how many of the fwd_allreduces were issued asynchronously, free to overlap the compute
        that follows them (real mode overlaps them; simulated mode sums at once, and counts them alike).
        With sequence parallelism: fwd_reduce_scatters, fwd_all_gathers, bwd_reduce_scatters, bwd_all_gathers and
        sp_bytes_per_token (their whole-buffer bytes), none of them in the all-reduce keys.
        With tp_comm_dtype: compressed_allreduces (how many fwd_allreduces moved block-quantized) and
        compressed_bytes_per_token (their compressed bytes, scales included, also in comm_bytes_per_token)."""
        n = max(1, micro_steps)
        c = self.compiled.tolist()
        fwd, fwd_bytes, bwd, bwd_bytes = self.fwd + c[0], self.fwd_bytes + c[1], self.bwd + c[2], self.bwd_bytes + c[3]
        vocab, vocab_bytes = self.vocab + c[4], self.vocab_bytes + c[5]
        out = dict(fwd_allreduces=fwd // n, bwd_allreduces=bwd // n, async_allreduces=(self.overlapped + c[6]) // n,
                   grad_sync_allreduces=self.grad_sync,
                   comm_bytes_per_token=(fwd_bytes + bwd_bytes) / (n * tokens), comm_seconds=self.seconds,
                   comm_busy_seconds=self.busy_seconds)
        if vocab:
            out.update(vocab_allreduces=vocab // n, vocab_bytes_per_token=vocab_bytes / (n * tokens))
        compressed, compressed_bytes = self.compressed + c[7], self.compressed_bytes + c[8]
        if compressed:  # tp_comm_dtype: these fwd all-reduces moved compressed; their bytes are in comm_bytes too
            out.update(compressed_allreduces=compressed // n,
                       compressed_bytes_per_token=compressed_bytes / (n * tokens))
        out.update(self.sp_report(n, tokens))  # sequence parallelism: fwd/bwd_reduce_scatters, _all_gathers, bytes
        return out


class SimulatedTP:
    """All tp shards in this process: shard-side tensors are (L, N, C) with L = tp."""

    real = False
    traceable = True  # torch.compile traces f and g (sums and expands) into its graph, backward included

    def __init__(self, tp, *, codec=None):
        self.tp, self.local, self.first_shard = tp, tp, 0
        self.codec = codec  # tpcomm.compression.Codec: g's partial sums move block-quantized; None: plain
        self.counter = CommCounter()

    def sum_shards(self, x):
        """(L, ...) partial results -> (...) their sum over the tp shards."""
        return x.sum(0)

    def sum_shards_async(self, x):
        """sum_shards to be waited for (see RealTP): summed at once here, nothing runs in the background.
        Returns (the sum, None: no work to wait for)."""
        return x.sum(0), None

    def sum_partials(self, x):
        """g's sum of the residual stream's partial sums (L, N, C) -> (N, C): sum_shards, or with a codec the sum of
        what each shard's partial sum arrives as, dequantized (see tpcomm.compression), in shard order."""
        return self.sum_shards(x) if self.codec is None else self.codec.reduce(x)

    def sum_partials_async(self, x):
        """sum_partials to be waited for: summed at once here, (the sum, None)."""
        return self.sum_partials(x), None

    def max_shards(self, x):
        """(L, ...) -> (...) the elementwise maximum over the tp shards."""
        return x.amax(0)

    def gather_shards(self, x):
        """(L, ..., K) -> (..., L*K): the shards' last dimensions side by side (shard order)."""
        return torch.cat(x.unbind(0), dim=-1)

    def synced(self, p):
        """A replicated parameter used on the synced stream (see RealTP.synced): nothing to do here."""
        return p

    # sequence parallelism: the synced stream is held whole, (N, C) = every tp rank's token shard side by side
    def token_offset(self, n_held):
        """The first token of the token-sharded stream held here (n_held of them): all are held, from 0."""
        return 0

    def gather_tokens(self, x):
        """All-gather along the tokens: the token shards (held whole) -> (N, C), nothing to move."""
        return x

    def reduce_scatter_tokens(self, x):
        """Reduce-scatter along the tokens: (L, N, C) partials -> their sum, every token shard of it (N, C)."""
        return x.sum(0)

    def delta(self, r, xbar):
        """d_i = r_i - xbar (see _Delta): the sum over shards of d's gradient is a sum over the L local shards."""
        return _Delta.apply(r, xbar, 1.0)

    def fan_out(self, xbar, norm, site=None):
        """The synced stream on the shards, r_i = f(xbar), and norm(r_i). Every shard's value is the same, so the
        norm runs once on xbar; its gradient still reaches xbar once per shard (through the expand)."""
        r = copy_to_tp_region(xbar, self, site=site)
        return r, norm(xbar).unsqueeze(0).expand_as(r)

    def sync_replicated_grads(self, grads):
        """Each replicated parameter has one gradient here, already whole."""

    def sum_over_shards(self, sq):
        """A per-rank scalar summed over the tp ranks (the sharded part of a squared gradient norm)."""
        return sq


class RealTP:
    """One shard per rank of a tp process group: shard-side tensors are (1, N, C)."""

    real = True
    traceable = False  # torch.compile runs f and g (c10d calls) eagerly between its graphs

    def __init__(self, tp, *, group, rank, codec=None):
        self.tp, self.local, self.first_shard = tp, 1, rank
        self.group, self.codec = group, codec
        self.counter = CommCounter()

    def all_reduce(self, t, op=dist.ReduceOp.SUM):
        """Sum (or op) over the tp group (a fresh tensor), timed into the counter."""
        t = t.contiguous().clone()
        start = time.perf_counter()
        dist.all_reduce(t, op=op, group=self.group)
        self.blocked(start)
        return t

    def all_reduce_async(self, t, op=dist.ReduceOp.SUM):
        """Start a sum (or op) over the tp group and return at once: (a fresh tensor, its torch.distributed work).
        The tensor holds the result only after work.wait() (see wait); the time to issue it is counted."""
        t = t.contiguous().clone()
        start = time.perf_counter()
        work = dist.all_reduce(t, op=op, group=self.group, async_op=True)
        return t, self.in_flight(work, start)

    def blocked(self, start):
        """A blocking collective that began at `start` has returned: exposed and busy alike."""
        dt = time.perf_counter() - start
        self.counter.seconds += dt
        self.counter.busy_seconds += dt

    def in_flight(self, work, start):
        """An asynchronous collective issued at `start`: its issue time is exposed; an InFlight to wait() on."""
        self.counter.seconds += time.perf_counter() - start
        return InFlight(work, start, self.counter)

    def wait(self, work):
        """Block until an asynchronous collective is done (an InFlight, or what wraps one), timed into the counter:
        the time blocked here is exposed communication."""
        start = time.perf_counter()
        work.wait()
        self.counter.seconds += time.perf_counter() - start

    def sum_shards(self, x):
        return self.all_reduce(x).squeeze(0)

    def sum_shards_async(self, x):
        """(1, ...) -> (the sum over the tp shards (...), still being reduced, its work): wait(work) before use."""
        t, work = self.all_reduce_async(x)
        return t.squeeze(0), work

    def sum_partials(self, x):
        """As SimulatedTP.sum_partials; with a codec an all-gather of the compressed partial sums (see
        sum_partials_async), then dequantized and summed here."""
        if self.codec is None:
            return self.sum_shards(x)
        out, work = self.sum_partials_async(x)
        self.wait(work)
        return out

    def sum_partials_async(self, x):
        """(1, N, C) -> ((N, C), work): sum_shards_async, or with a codec an all-gather of every rank's packed
        partial sum (uint8: scales, then values) issued now; the (N, C) buffer holds the sum of the dequantized
        partials, in rank order, once wait(work) has returned."""
        if self.codec is None:
            return self.sum_shards_async(x)
        if self.codec.exchange == "two_shot":
            return self.two_shot_async(x)
        payload = self.codec.pack(x[0])
        gathered = payload.new_empty(self.tp * payload.numel())  # every rank's payload, rank order
        start = time.perf_counter()
        work = self.in_flight(dist.all_gather_single(gathered, payload, group=self.group, async_op=True), start)
        out = x.new_empty(x.shape[1:])
        return out, _Decompress(work, gathered.view(self.tp, -1), self.codec, out)

    def two_shot_async(self, x):
        """The two_shot exchange of (1, N, C) partial sums (tpcomm.compression): the rows in tp chunks of
        ceil(N/tp) (zero-padded), chunk j of every rank's packed partial sent to rank j by an all-to-all issued now;
        wait(work) sums the dequantized chunks, all-gathers that sum packed again and writes all of it into the
        (N, C) buffer returned. The all-gather runs inside wait: exposed, while the all-to-all may overlap."""
        rows = x[0].reshape(-1, x.shape[-1])
        per = -(-rows.shape[0] // self.tp)
        padded = torch.nn.functional.pad(rows, (0, 0, 0, per * self.tp - rows.shape[0]))
        send = self.codec.pack_each(padded.view(self.tp, per, -1))  # (tp, chunk payload): chunk j goes to rank j
        # the buffers a collective writes are not views (torch.compile: a compiled region's output viewed, then
        # written in place, is refused)
        recv = send.new_empty(send.numel())
        start = time.perf_counter()
        work = self.in_flight(dist.all_to_all_single(recv, send.reshape(-1), group=self.group, async_op=True), start)
        out = x.new_empty(x.shape[1:])
        return out, _TwoShot(self, work, recv.view(self.tp, -1), out, per)

    def max_shards(self, x):
        return self.all_reduce(x, op=dist.ReduceOp.MAX).squeeze(0)

    def gather_shards(self, x):
        parts = [torch.empty_like(x) for _ in range(self.tp)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat([p.squeeze(0) for p in parts], dim=-1)

    def token_offset(self, n_held):
        """The first token of this rank's n_held = N/tp contiguous tokens of the token-sharded stream."""
        return self.first_shard * n_held

    def gather_tokens(self, x):
        """All-gather along the tokens: this rank's (N/tp, C) -> (N, C), the ranks' shards in rank order."""
        x = x.contiguous()
        out = x.new_empty(x.shape[0] * self.tp, *x.shape[1:])
        start = time.perf_counter()
        dist.all_gather_single(out, x, group=self.group)
        self.blocked(start)
        return out

    def reduce_scatter_tokens(self, x):
        """Reduce-scatter along the tokens: (1, N, C) partials -> this rank's (N/tp, C) rows of their sum."""
        x = x.squeeze(0).contiguous()
        out = x.new_empty(x.shape[0] // self.tp, *x.shape[1:])
        start = time.perf_counter()
        dist.reduce_scatter_single(out, x, group=self.group)
        self.blocked(start)
        return out

    def synced(self, p):
        """A replicated block parameter used on the synced stream. Real mode sums the gradients of block-replicated
        parameters over the tp group after backward; this use's gradient is equal on every rank, so it enters that
        sum as 1/tp of itself."""
        return _ScaleGrad.apply(p, 1.0 / self.tp)

    def delta(self, r, xbar):
        """d_i = r_i - xbar. Each rank holds one of tp equal gradient terms of xbar (g's backward gives every rank
        the same gradient), so the sum over shards is tp times the local one."""
        return _Delta.apply(r, xbar, float(self.tp))

    def fan_out(self, xbar, norm, site=None):
        r = copy_to_tp_region(xbar, self, site=site)
        return r, norm(r)

    def sync_replicated_grads(self, grads):
        """Sum the given gradients over the tp group in one all-reduce (in place); counted as a gradient sync."""
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        with traced(self, "sum", "bwd", GRAD_SYNC, flat.numel() * flat.element_size()):
            flat = self.all_reduce(flat)
        self.counter.grad_sync += 1
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def sum_over_shards(self, sq):
        with traced(self, "sum", "bwd", GRAD_NORM, sq.element_size()):
            return self.all_reduce(sq.view(1)).view(())


class InFlight:
    """An asynchronous collective's torch.distributed work, timed: a callback on its future notes when it completed
    (on the communication thread), so wait() can add issue-to-completion to the counter's busy_seconds."""

    def __init__(self, work, start, counter):
        self.work, self.start, self.counter, self.done = work, start, counter, None
        work.get_future().add_done_callback(self.completed)

    def completed(self, _future):
        self.done = time.perf_counter()

    def wait(self):
        self.work.wait()
        # the callback may run just after wait() returns: then now is the completion time, within microseconds
        self.counter.busy_seconds += (self.done or time.perf_counter()) - self.start


class _Decompress:
    """The work of a compressed sum_partials_async: wait() waits for the all-gather into `gathered` (tp, payload
    bytes), then writes the sum of the dequantized partials into `out` (the buffer g's result already is)."""

    def __init__(self, work, gathered, codec, out):
        self.work, self.gathered, self.codec, self.out = work, gathered, codec, out

    def wait(self):
        self.work.wait()
        # written through .data, unseen by autograd (as an all-reduce writes its buffer): g's output, a view of out
        # made by _Reduced, is not to be read before this wait, and nothing has used it yet
        self.out.data.copy_(self.codec.unpack(self.gathered, self.out.shape, self.out.dtype).sum(0))


class _TwoShot:
    """The work of a two_shot sum_partials_async: wait() waits for the all-to-all of the packed row chunks into
    `recv` (tp, chunk payload), sums this rank's chunk dequantized, all-gathers it packed again (blocking, timed as
    busy here and as exposed by RealTP.wait) and writes every rank's chunk, dequantized, into `out`."""

    def __init__(self, group, work, recv, out, per):
        self.group, self.work, self.recv, self.out, self.per = group, work, recv, out, per

    @torch.compiler.disable  # eager, as real mode's collectives are: its buffers are written in place between them
    def wait(self):
        self.work.wait()
        g, codec, shape = self.group, self.group.codec, (self.per, self.out.shape[-1])
        mine = codec.unpack(self.recv, shape, self.out.dtype).sum(0)  # this rank's rows of the sum, rank order
        payload = codec.pack(mine)
        gathered = payload.new_empty(g.tp * payload.numel())
        start = time.perf_counter()
        dist.all_gather_single(gathered, payload, group=g.group)
        g.counter.busy_seconds += time.perf_counter() - start
        rows = codec.unpack(gathered.view(g.tp, -1), shape, self.out.dtype).reshape(-1, shape[1])
        self.out.data.copy_(rows[:self.out.numel() // shape[1]].view(self.out.shape))  # as _Decompress writes


def tp_group(tp, pd=None, *, codec=None):
    """RealTP when the process grid has a tp dimension of more than one rank, else SimulatedTP. codec: compress g's
    partial sums (tpcomm.compression.Codec; None: plain all-reduces)."""
    if pd is not None and pd.tp > 1:
        return RealTP(tp, group=pd.tp_group, rank=pd.tp_rank, codec=codec)
    return SimulatedTP(tp, codec=codec)


def _in_autocast_dtype(x):
    """Under autocast f's output only feeds matmuls and g's input comes from them: both move in the autocast
    dtype, so the collectives carry bf16 both ways, as Megatron's do (forward values do not change)."""
    if torch.is_autocast_enabled(x.device.type):
        return x.to(torch.get_autocast_dtype(x.device.type))
    return x


def _count(group, direction, t, vocab=False, overlapped=False, compressed=False):
    """Count a collective of t (L, ...) and return the bytes each rank contributes (0: one rank, nothing moves);
    compressed: g's partial sums block-quantized by group.codec, counted as their payload, scales included."""
    if group.tp > 1:  # a collective over one rank moves nothing (Megatron skips it)
        values = t.numel() // group.local
        nbytes = group.codec.payload_bytes(values) if compressed else values * t.element_size()
        group.counter.add(direction, nbytes, vocab=vocab, overlapped=overlapped, compressed=compressed)
        return nbytes
    return 0


# Where a collective runs, for its trace label: (layer or None, block type or None, site). Blocks pass their own
# (ShardedBlock.sites); these are the model-level ones.
FINAL_SYNC, OTHER = (None, None, "final_sync"), (None, None, "other")
VOCAB_EMBED, VOCAB_HEAD = (None, None, "vocab_embed"), (None, None, "vocab_head")
VOCAB_LOSS = (None, None, "vocab_loss")
GRAD_SYNC, GRAD_NORM = (None, None, "grad_sync"), (None, None, "grad_norm")
_NOT_RECORDED = contextlib.nullcontext()  # stateless: one instance serves every untraced collective


def traced(group, op, direction, site, nbytes, *, waiting=False, collective="allreduce"):
    """A profiler span labelled for this collective while a profiler records (see the module docstring), else a
    context that does nothing: the label is formatted only while tracing. Not inside torch.compile'd code.
    waiting=True: the span of the wait for an asynchronous one ('wait ' before its label)."""
    if group.tp == 1 or torch.compiler.is_compiling() or not torch.autograd.profiler._is_profiler_enabled:
        return _NOT_RECORDED
    layer, block, where = site or OTHER
    at = "" if layer is None else f" L{layer} {block}"
    label = f"{collective} {op} {direction}{at} {where} {nbytes}B {'real' if group.real else 'sim'}"
    return torch.profiler.record_function(f"wait {label}" if waiting else label)


class _CopyToTPRegion(torch.autograd.Function):
    """f: identity forward (fan-out), all-reduce backward."""

    @staticmethod
    def forward(ctx, x, group, vocab, site):
        ctx.group, ctx.vocab, ctx.site = group, vocab, site
        return x.unsqueeze(0).expand(group.local, *x.shape)

    @staticmethod
    def backward(ctx, grad):
        # compiled, this backward runs no Python per step: copy_to_tp_region counted it when tracing the forward
        nbytes = 0 if torch.compiler.is_compiling() else _count(ctx.group, "bwd", grad, ctx.vocab)
        with traced(ctx.group, "f", "bwd", ctx.site, nbytes):
            return ctx.group.sum_shards(grad), None, None, None


class _ReduceFromTPRegion(torch.autograd.Function):
    """g: all-reduce forward, identity backward (the gradient fans out to the shards)."""

    @staticmethod
    def forward(ctx, x, group, vocab, site):
        ctx.group = group
        # the residual stream's partial sums move compressed when the group has a codec; the vocab-parallel
        # embedding's never (docs/compression.md)
        compressed = group.codec is not None and not vocab
        with traced(group, "g", "fwd", site, _count(group, "fwd", x, vocab, compressed=compressed)):
            return group.sum_partials(x) if compressed else group.sum_shards(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.unsqueeze(0).expand(ctx.group.local, *grad.shape), None, None, None


def copy_to_tp_region(x, group, *, vocab=False, site=None):
    """f: (N, C) replicated -> (L, N, C) on the shards; backward all-reduces the shards' gradients.
    vocab=True counts it with the vocab-parallel collectives instead of the residual-stream syncs.
    site: where it runs, (layer, block type, site name), for its trace label only (see traced)."""
    x = _in_autocast_dtype(x)
    if group.traceable and torch.compiler.is_compiling() and torch.is_grad_enabled() and x.requires_grad:
        _count(group, "bwd", x.unsqueeze(0).expand(group.local, *x.shape), vocab)  # the backward all-reduce to come
    return _CopyToTPRegion.apply(x, group, vocab, site)


def reduce_from_tp_region(x, group, *, vocab=False, site=None):
    """g: (L, N, C) partial results -> (N, C), their sum over all tp shards; backward identity."""
    return _ReduceFromTPRegion.apply(_in_autocast_dtype(x), group, vocab, site)


class _Reduced(torch.autograd.Function):
    """An asynchronous g's result as g's output in autograd: forward passes the (N, C) buffer the all-reduce writes
    on (reading nothing: its data may still be on the way); backward is g's, the gradient fanned out to the
    (L, N, C) partial results."""

    @staticmethod
    def forward(ctx, x, reduced):
        ctx.local = x.shape[0]
        return reduced

    @staticmethod
    def backward(ctx, grad):
        return grad.unsqueeze(0).expand(ctx.local, *grad.shape), None


class AsyncReduction:
    """An all-reduce issued by reduce_from_tp_region_async, maybe still running. `value` is g's result, (N, C),
    already in autograd as g's output (backward: identity, fanned out to the partial results), but its data is
    there only once wait() has returned: real mode blocks until the all-reduce is done (simulated mode summed at
    issue). wait() returns value; waiting again does nothing. The wait is a trace span of its own."""

    def __init__(self, x, group, site, nbytes):
        self.group, self.site, self.nbytes = group, site, nbytes
        with traced(group, "g_async", "fwd", site, nbytes):  # the issue
            reduced, self.work = group.sum_partials_async(x.detach())
        self.value, self.waited = _Reduced.apply(x, reduced), False

    def wait(self):
        if not self.waited:
            with traced(self.group, "g_async", "fwd", self.site, self.nbytes, waiting=True):
                if self.work is not None:  # real mode (simulated mode summed at issue)
                    self.group.wait(self.work)
            self.work, self.waited = None, True
        return self.value


def reduce_from_tp_region_async(x, group, *, site=None):
    """g issued without waiting: (L, N, C) partial results -> an AsyncReduction at once, whose wait() gives their
    sum over all tp shards (N, C); backward identity, as g. In real mode the all-reduce runs in the background until
    wait(), so work issued in between overlaps it. Counted as g (a forward all-reduce), and as asynchronous."""
    x = _in_autocast_dtype(x)
    return AsyncReduction(x, group, site, _count(group, "fwd", x, overlapped=True, compressed=group.codec is not None))


# ---------- sequence parallelism (Megatron-LM, arXiv 2205.05198): f and g along the tokens ----------
# Between blocks the synced stream is sharded along the N = B*T tokens: rank j holds tokens [j*N/tp, (j+1)*N/tp)
# (simulated: held whole, every shard side by side). f becomes an all-gather of the tokens (backward: reduce-scatter)
# and g a reduce-scatter (backward: all-gather). Counted apart from the all-reduces (CommCounter.add_sp).

RS, AG = "rs", "ag"
_SP_LABEL = {RS: "reduce_scatter", AG: "all_gather"}


def _count_sp(group, direction, kind, nbytes):
    """Count a reduce-scatter or all-gather of nbytes (the whole (N, C) buffer per rank: a reduce-scatter's input,
    an all-gather's output); returns nbytes (0 at one rank: nothing moves)."""
    if group.tp == 1:
        return 0
    group.counter.add_sp(direction, kind, nbytes)
    return nbytes


def _whole_bytes(group, x):
    """Bytes of the whole (N, C) stream that x, a token shard (N/tp, C) (simulated: the whole), is part of."""
    return x.numel() * x.element_size() * (group.tp if group.real else 1)


def _bytes(x):
    return x.numel() * x.element_size()


def _backward_count(group, kind, nbytes):
    """The count of a backward collective: in Python when backward runs; compiled code runs no Python there, so
    the wrapper counted it when the forward was traced (_count_when_compiling)."""
    return 0 if torch.compiler.is_compiling() else _count_sp(group, "bwd", kind, nbytes)


def _count_when_compiling(group, x, kind, nbytes):
    if group.traceable and torch.compiler.is_compiling() and torch.is_grad_enabled() and x.requires_grad:
        _count_sp(group, "bwd", kind, nbytes)


class _GatherToTPRegion(torch.autograd.Function):
    """f under sequence parallelism: all-gather of the token shards to every tp shard (L, N, C) forward,
    reduce-scatter of the shards' gradients backward."""

    @staticmethod
    def forward(ctx, x, group, site):
        ctx.group, ctx.site = group, site
        with traced(group, "f", "fwd", site, _count_sp(group, "fwd", AG, _whole_bytes(group, x)),
                    collective=_SP_LABEL[AG]):
            full = group.gather_tokens(x)
        return full.unsqueeze(0).expand(group.local, *full.shape)

    @staticmethod
    def backward(ctx, grad):
        with traced(ctx.group, "f", "bwd", ctx.site, _backward_count(ctx.group, RS, _bytes(grad[0])),
                    collective=_SP_LABEL[RS]):
            return ctx.group.reduce_scatter_tokens(grad), None, None


class _ReduceScatterFromTPRegion(torch.autograd.Function):
    """g under sequence parallelism: reduce-scatter of the shards' partial sums (L, N, C) to the token shards
    forward, all-gather of the gradient backward (fanned out to the shards)."""

    @staticmethod
    def forward(ctx, x, group, site):
        ctx.group, ctx.site = group, site
        with traced(group, "g", "fwd", site, _count_sp(group, "fwd", RS, _bytes(x[0])), collective=_SP_LABEL[RS]):
            return group.reduce_scatter_tokens(x)

    @staticmethod
    def backward(ctx, grad):
        group = ctx.group
        with traced(group, "g", "bwd", ctx.site, _backward_count(group, AG, _whole_bytes(group, grad)),
                    collective=_SP_LABEL[AG]):
            full = group.gather_tokens(grad)
        return full.unsqueeze(0).expand(group.local, *full.shape), None, None


class _ScatterToSequence(torch.autograd.Function):
    """The embedding output onto the token-sharded stream: this rank's rows forward (nothing moves), all-gather of
    the gradient backward (so the replicated embedding gets every token's gradient on every rank)."""

    @staticmethod
    def forward(ctx, x, group, site):
        ctx.group, ctx.site = group, site
        n = x.shape[0] // (group.tp if group.real else 1)
        start = group.token_offset(n)
        return x[start:start + n]

    @staticmethod
    def backward(ctx, grad):
        group = ctx.group
        with traced(group, "scatter", "bwd", ctx.site, _backward_count(group, AG, _whole_bytes(group, grad)),
                    collective=_SP_LABEL[AG]):
            return group.gather_tokens(grad), None, None


class _GatherFromSequence(torch.autograd.Function):
    """The token-sharded stream gathered whole (before ln_f): all-gather forward; backward this rank's rows of the
    gradient, which is the same on every rank (what follows is replicated, or begins with f): nothing moves."""

    @staticmethod
    def forward(ctx, x, group, site):
        ctx.n, ctx.start = x.shape[0], group.token_offset(x.shape[0])
        with traced(group, "gather", "fwd", site, _count_sp(group, "fwd", AG, _whole_bytes(group, x)),
                    collective=_SP_LABEL[AG]):
            return group.gather_tokens(x)

    @staticmethod
    def backward(ctx, grad):
        return grad[ctx.start:ctx.start + ctx.n], None, None


def gather_to_tp_region(x, group, *, site=None):
    """f under sequence parallelism: the token shards (N/tp, C) (simulated: held whole, (N, C)) -> (L, N, C) on the
    tp shards (all-gather); backward reduce-scatters the shards' gradients back to the token shards."""
    x = _in_autocast_dtype(x)
    _count_when_compiling(group, x, RS, _whole_bytes(group, x))
    return _GatherToTPRegion.apply(x, group, site)


def reduce_scatter_from_tp_region(x, group, *, site=None):
    """g under sequence parallelism: (L, N, C) partial results -> this rank's token shard of their sum (N/tp, C)
    (simulated: every shard, (N, C)) (reduce-scatter); backward all-gathers the gradient."""
    x = _in_autocast_dtype(x)
    _count_when_compiling(group, x, AG, _bytes(x[0]))
    return _ReduceScatterFromTPRegion.apply(x, group, site)


def scatter_to_sequence_region(x, group, *, site=None):
    """(N, C) replicated -> this rank's token shard (N/tp, C) (simulated: the whole (N, C)); backward all-gather."""
    _count_when_compiling(group, x, AG, _bytes(x))
    return _ScatterToSequence.apply(x, group, site)


def gather_from_sequence_region(x, group, *, site=None):
    """The token shards -> the whole (N, C) on every rank (all-gather); backward takes this rank's rows."""
    return _GatherFromSequence.apply(x, group, site)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy from logits sharded over the vocabulary, without gathering them (Megatron-LM's
    vocab-parallel cross-entropy): three per-token all-reduces (max, sum of exp, target logit). Backward is local:
    softmax - one-hot on each shard's columns."""

    @staticmethod
    def forward(ctx, logits, targets, group, vocab_start, ignore_index):
        # logits (L, N, Vs) float32; vocab_start (L, 1) first vocabulary id of each local shard; targets (N,)
        def reduce(reduce_shards, op, x):  # (L, N) -> (N,) over the tp shards, counted and traced
            with traced(group, op, "fwd", VOCAB_LOSS, _count(group, "fwd", x, vocab=True)):
                return reduce_shards(x)

        m = reduce(group.max_shards, "max", logits.amax(-1))  # (N,) the max over the whole vocabulary
        e = torch.exp(logits - m.unsqueeze(-1))
        s = reduce(group.sum_shards, "sum", e.sum(-1))  # (N,)
        local = targets.unsqueeze(0) - vocab_start  # (L, N) target's column on each shard
        mine = (local >= 0) & (local < logits.size(-1))
        t = logits.gather(-1, local.clamp(0, logits.size(-1) - 1).unsqueeze(-1)).squeeze(-1)
        t = reduce(group.sum_shards, "sum", torch.where(mine, t, torch.zeros_like(t)))  # (N,) the target's logit
        valid = targets != ignore_index
        n = valid.sum().clamp(min=1)
        loss = ((s.log() + m - t) * valid).sum() / n.to(logits.dtype)
        ctx.save_for_backward(e, s, local, mine, valid, n)
        return loss

    @staticmethod
    def backward(ctx, grad):
        e, s, local, mine, valid, n = ctx.saved_tensors
        g = e / s.unsqueeze(-1)  # softmax on this shard's columns
        g.scatter_add_(-1, local.clamp(0, g.size(-1) - 1).unsqueeze(-1), -mine.unsqueeze(-1).to(g.dtype))
        return g * (valid.to(g.dtype) * (grad / n)).unsqueeze(-1), None, None, None, None


def vocab_parallel_cross_entropy(logits, targets, group, vocab_start, *, ignore_index=-1):
    """Mean cross-entropy over the tokens whose target is not ignore_index; logits (L, N, Vs) of the local
    vocabulary shards, with padded columns set to -inf."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # fp32 at least (bf16 logits), fp64 kept
    return _VocabParallelCrossEntropy.apply(logits, targets, group, vocab_start, ignore_index)


f, g = copy_to_tp_region, reduce_from_tp_region  # the names the literature uses


def _is_one_tensor_for_all_shards(grad):
    """True for the gradient g's backward produces: one (N, C) tensor expanded over the shards (stride 0)."""
    return grad.dim() > 0 and grad.stride(0) == 0


class _Delta(torch.autograd.Function):
    """d_i = r_i - xbar, (L, N, C), (N, C) -> (L, N, C): a fresh tensor (not a view) that a shard projection may
    accumulate into in place. Backward: xbar's gradient is minus the sum of d's gradient over all tp shards,
    `scale` times the sum over the local ones."""

    @staticmethod
    def forward(ctx, r, xbar, scale):
        ctx.scale = scale
        return r - xbar

    @staticmethod
    def backward(ctx, grad):
        if _is_one_tensor_for_all_shards(grad):
            total = grad[0] * (grad.shape[0] * ctx.scale)
        else:
            total = grad.sum(0) * ctx.scale if ctx.scale != 1.0 else grad.sum(0)
        return grad, total.neg_(), None


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p, scale):
        ctx.scale = scale
        return p.view_as(p)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None
