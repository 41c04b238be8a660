"""
Tensor-parallel communication: Megatron-LM's two operators as autograd functions, and the groups they run on.

    copy_to_tp_region     (f)  forward: identity, a replicated (N, C) value fans out to the shards (L, N, C)
                               backward: all-reduce (sum) of the shards' gradients
    reduce_from_tp_region (g)  forward: all-reduce (sum) of the shards' partial results (L, N, C) -> (N, C)
                               backward: identity
    reduce_from_tp_region_async  g issued without waiting: returns an AsyncReduction at once; its wait()
                               gives g's result. Real mode runs the all-reduce in the background meanwhile, so
                               compute that
                               does not need the result overlaps it (the ladder block; overlapped TP)

A group is SimulatedTP (one process holds all tp shards as the leading dimension L = tp of every shard-side
tensor; the all-reduce is a sum over that dimension) or RealTP (each rank holds its own shard, L = 1; the
all-reduce is torch.distributed.all_reduce over the tp process group). The block code is the same for both.
The operators count every collective they run (CommCounter), so communication is measured, not computed.

While a profiler records (torch.profiler; comm_trace.trace_steps), every collective also runs inside a
torch.profiler.record_function span named for a trace (comm_trace.collective_events parses it back):

The collectives are counted and labelled for traces where they run (tpcomm/tp/counting.py); sequence
parallelism's gathers and scatters: tpcomm/tp/sequence_parallel.py; the compressed exchanges of g:
tpcomm/tp/compress/compressed_exchange.py; the vocabulary-parallel loss: tpcomm/tp/vocab_parallel.py.
"""

import contextlib

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from tpcomm.tp.compress import compressed_exchange
# torch < 2.13: the older names
from tpcomm.tp.compress.compressed_exchange import all_gather_single, reduce_scatter_single
from tpcomm.tp.counting import (CommCounter, CudaEventClock, GRAD_NORM, GRAD_SYNC, Timing, WALL_CLOCK,
                                count_collective, direction_now, traced)


class SimulatedTP:
    """All tp shards in this process: shard-side tensors are (L, N, C) with L = tp."""

    real = False
    traceable = True  # torch.compile traces f and g (sums and expands) into its graph, backward included

    def __init__(self, tp, *, codec=None):
        self.tp, self.local, self.first_shard = tp, tp, 0
        # tpcomm.tp.compress.compression.Codec: g's partial sums move block-quantized; None: plain
        self.codec = codec
        self.counter = CommCounter()

    def sum_shards(self, x):
        """(L, ...) partial results -> (...) their sum over the tp shards."""
        return x.sum(0)

    def sum_shards_async(self, x):
        """sum_shards to be waited for (see RealTP): summed at once here, nothing runs in the background.
        Returns (the sum, None: no work to wait for)."""
        return x.sum(0), None

    def sum_partials(self, x):
        """g's sum of the residual stream's partial sums (L, N, C) -> (N, C): sum_shards, or with a codec
        the sum of what each shard's partial sum arrives as, dequantized (see
        tpcomm.tp.compress.compression), in shard order."""
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
        """Reduce-scatter along the tokens: (L, N, C) partials -> their sum, every
        token shard of it (N, C)."""
        return x.sum(0)

    def delta(self, r, xbar):
        """d_i = r_i - xbar (see _Delta): the sum over shards of d's gradient is a
        sum over the L local shards."""
        return _Delta.apply(r, xbar, 1.0)

    def fan_out(self, xbar, norm, site=None):
        """The synced stream on the shards, r_i = f(xbar), and norm(r_i). Every shard's value is the
        same, so the norm runs once on xbar; its gradient still reaches xbar once per shard (through the
        expand). r_i keeps the stream's value exactly under autocast (see fan_out_stream); the norm feeds
        matmuls, which autocast casts."""
        r = fan_out_stream(xbar, self, site)
        return r, norm(xbar).unsqueeze(0).expand_as(r)

    def sync_replicated_grads(self, grads):
        """Each replicated parameter has one gradient here, already whole."""

    def sum_over_shards(self, sq):
        """A per-rank scalar summed over the tp ranks (the sharded part of a squared gradient norm)."""
        return sq


class RealTP:
    """One shard per rank of a tp process group: shard-side tensors are (1, N, C)."""

    real = True
    # torch.compile traces f and g into its graph, backward included: while compiling, every collective is one
    # of torch's functional collectives (torch.distributed._functional_collectives: all_reduce,
    # all_gather_tensor, reduce_scatter_tensor, all_to_all_single, each waited for by wait_tensor), which
    # dynamo traces and inductor schedules; eager, the c10d calls below. A compiled step runs no Python per
    # collective: it counts them (into the counter's compiled slots) but does not time them (docs/trace.md)
    traceable = True

    def __init__(self, tp, *, group, rank, codec=None, clock=None):
        self.tp, self.local, self.first_shard = tp, 1, rank
        self.group, self.codec = group, codec
        self.counter = CommCounter()
        # how collectives are timed (counting.Timing): None picks per tensor (clock_for); a test passes a fake
        self.clock = clock
        self.event_clock = None

    def clock_for(self, t):
        """CUDA events for CUDA tensors (NCCL, and gloo on CUDA, return before the device has done the work),
        wall time otherwise (gloo on CPU runs the collective on the host)."""
        if self.clock is not None:
            return self.clock
        if t.is_cuda:
            self.event_clock = self.event_clock or CudaEventClock()
            return self.event_clock
        return WALL_CLOCK

    def all_reduce(self, t, op=dist.ReduceOp.SUM, *, direction=None):
        """Sum (or op) over the tp group (a fresh tensor), timed into the counter (direction: fwd or bwd, by
        default the pass it runs in)."""
        if torch.compiler.is_compiling():
            return funcol.wait_tensor(funcol.all_reduce(t.contiguous(), _FUNCTIONAL_OPS[op], self.group))
        t = t.contiguous().clone()
        clock = self.clock_for(t)
        start = clock.now()
        dist.all_reduce(t, op=op, group=self.group)
        self.blocked(start, clock, direction=direction)
        return t

    def all_reduce_async(self, t, op=dist.ReduceOp.SUM):
        """Start a sum (or op) over the tp group and return at once: (a fresh tensor, an InFlight holding its
        torch.distributed work). The tensor holds the result only after wait(); the time to issue it is
        counted. Compiling: (the functional all-reduce's result, None): inductor decides where it waits."""
        if torch.compiler.is_compiling():
            return self.all_reduce(t, op), None
        t = t.contiguous().clone()
        clock = self.clock_for(t)
        start = clock.now()
        work = dist.all_reduce(t, op=op, group=self.group, async_op=True)
        return t, self.in_flight(work, start, clock)

    def blocked(self, start, clock=WALL_CLOCK, *, direction=None):
        """A blocking collective that began at `start` (a mark of `clock`) has
        returned: exposed and busy alike."""
        self.counter.add_timing(Timing(clock, direction or direction_now(), start, clock.now()))

    def in_flight(self, work, start, clock=WALL_CLOCK):
        """An asynchronous collective issued at `start` (a mark of `clock`): its issue time is exposed;
        an InFlight to wait() on."""
        return InFlight(work, Timing(clock, direction_now(), start, clock.now()), self.counter)

    @contextlib.contextmanager
    def codec_time(self, t):
        """Times the enclosed codec work on t's device (quantize, dequantize, sum)
        as counter.codec_seconds."""
        clock = self.clock_for(t)
        start = clock.now()
        yield
        self.counter.add_timing(Timing(clock, direction_now(), start, clock.now(), codec=True))

    def wait(self, work):
        """Block until an asynchronous collective is done (an InFlight, or what wraps one): the InFlight adds
        the time blocked here as exposed communication, and its issue to completion as busy. None: nothing to
        wait for (compiled: a functional collective)."""
        if work is not None:
            work.wait()

    def sum_shards(self, x):
        return self.all_reduce(x).squeeze(0)

    def sum_shards_async(self, x):
        """(1, ...) -> (the sum over the tp shards (...), still being reduced, its
        work): wait(work) before use."""
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
        partial sum (uint8: scales, then values) issued now; the (N, C) buffer holds the sum of the
        dequantized partials, in rank order, once wait(work) has returned."""
        if self.codec is None:
            return self.sum_shards_async(x)
        if torch.compiler.is_compiling():  # functional collectives, the codec work traced around them
            return compressed_exchange.compiled(self, x), None
        if self.codec.exchange == "two_shot":
            return compressed_exchange.two_shot_async(self, x)
        return compressed_exchange.one_shot_async(self, x)

    def max_shards(self, x):
        return self.all_reduce(x, op=dist.ReduceOp.MAX).squeeze(0)

    def gather_shards(self, x):
        if torch.compiler.is_compiling():  # (tp, ..., K): every rank's (1, ..., K) in rank order
            return torch.cat(self.all_gather(x).unbind(0), dim=-1)
        parts = [torch.empty_like(x) for _ in range(self.tp)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat([p.squeeze(0) for p in parts], dim=-1)

    def all_gather(self, x):
        """Compiling: the functional all-gather of x along dim 0, rank order (tp * x.shape[0], ...)."""
        return funcol.wait_tensor(funcol.all_gather_tensor(x.contiguous(), 0, self.group))

    def token_offset(self, n_held):
        """The first token of this rank's n_held = N/tp contiguous tokens of the token-sharded stream."""
        return self.first_shard * n_held

    def gather_tokens(self, x):
        """All-gather along the tokens: this rank's (N/tp, C) -> (N, C), the ranks' shards in rank order."""
        x = x.contiguous()
        if torch.compiler.is_compiling():
            return self.all_gather(x)
        out = x.new_empty(x.shape[0] * self.tp, *x.shape[1:])
        clock = self.clock_for(x)
        start = clock.now()
        all_gather_single(out, x, group=self.group)
        self.blocked(start, clock)
        return out

    def reduce_scatter_tokens(self, x):
        """Reduce-scatter along the tokens: (1, N, C) partials -> this rank's (N/tp, C) rows of their sum."""
        x = x.squeeze(0).contiguous()
        if torch.compiler.is_compiling():
            return funcol.wait_tensor(funcol.reduce_scatter_tensor(x, "sum", 0, self.group))
        out = x.new_empty(x.shape[0] // self.tp, *x.shape[1:])
        clock = self.clock_for(x)
        start = clock.now()
        reduce_scatter_single(out, x, group=self.group)
        self.blocked(start, clock)
        return out

    def synced(self, p):
        """A replicated block parameter used on the synced stream. Real mode sums the gradients of
        block-replicated parameters over the tp group after backward; this use's gradient is equal on every
        rank, so it enters that sum as 1/tp of itself."""
        return _ScaleGrad.apply(p, 1.0 / self.tp)

    def delta(self, r, xbar):
        """d_i = r_i - xbar. Each rank holds one of tp equal gradient terms of xbar (g's backward gives every
        rank the same gradient), so the sum over shards is tp times the local one."""
        return _Delta.apply(r, xbar, float(self.tp))

    def fan_out(self, xbar, norm, site=None):
        r = fan_out_stream(xbar, self, site)  # the residual stream's exact value (see SimulatedTP.fan_out)
        return r, norm(r)

    def sync_replicated_grads(self, grads):
        """Sum the given gradients over the tp group in one all-reduce (in place);
        counted as a gradient sync."""
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        with traced(self, "sum", "bwd", GRAD_SYNC, flat.numel() * flat.element_size()):
            # after backward, part of it (as its trace label says)
            flat = self.all_reduce(flat, direction="bwd")
        self.counter.grad_sync += 1
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def sum_over_shards(self, sq):
        with traced(self, "sum", "bwd", GRAD_NORM, sq.element_size()):
            return self.all_reduce(sq.view(1), direction="bwd").view(())


_FUNCTIONAL_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.MAX: "max"}  # c10d's ops by the functional names


class InFlight:
    """An asynchronous collective's torch.distributed work and its Timing (issue marks taken): a
    callback on the work's future marks its completion (a wall-clock time on gloo's thread; on CUDA
    an event on a stream that waits for the collective), so wait() can add issue-to-completion as
    busy and the time it blocked as exposed."""

    def __init__(self, work, timing, counter):
        self.work, self.timing, self.counter = work, timing, counter
        work.get_future().add_done_callback(self.completed)

    def completed(self, _future):
        self.timing.done = self.timing.clock.now()

    def wait(self):
        if self.timing is None:  # waited already
            return
        clock = self.timing.clock
        w0 = clock.now()
        self.work.wait()
        self.timing.waited = (w0, clock.now())
        self.counter.add_timing(self.timing)
        self.timing = None


def tp_group(tp, pd=None, *, codec=None):
    """RealTP when the process grid has a tp dimension of more than one rank, else SimulatedTP. codec:
    compress g's partial sums (tpcomm.tp.compress.compression.Codec; None: plain all-reduces)."""
    if pd is not None and pd.tp > 1:
        return RealTP(tp, group=pd.tp_group, rank=pd.tp_rank, codec=codec)
    return SimulatedTP(tp, codec=codec)


def in_autocast_dtype(x):
    """Under autocast f's output only feeds matmuls and g's input comes from them: both move in the
    autocast dtype, so the collectives carry bf16 both ways, as Megatron's do (forward values do not
    change). Where that is not so (the residual stream fanned out, the vocab-parallel embedding's sum),
    the caller runs f or g under keep_dtype."""
    if torch.is_autocast_enabled(x.device.type):
        return x.to(torch.get_autocast_dtype(x.device.type))
    return x


def keep_dtype(x):
    """A context in which f and g move x in its own dtype, autocast or not: for a value that enters
    the residual stream rather than a matmul (the vocab-parallel embedding's sum: fp32 under bf16
    autocast, as GPT's embedding)."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.autocast(x.device.type, enabled=False)
    return contextlib.nullcontext()


def fan_out_stream(xbar, group, site):
    """r_i = f(xbar): the synced residual stream on the shards, its value exactly xbar's under autocast too.
    f moves the autocast dtype (its backward all-reduce carries bf16, as before); its bf16(xbar) alone
    would start each shard's stream rounded, and delta(y, xbar) would then add tp * (bf16(xbar) - xbar)
    to the fp32 stream in every 'spd' and 'parallel' block. So the rounding error, xbar - bf16(xbar)
    (exact in fp32), is added back, outside autograd: the value is xbar bit for bit (b + (x - b) = x when
    b is x rounded), the gradient f's as before."""
    r = copy_to_tp_region(xbar, group, site=site)
    if r.dtype == xbar.dtype:
        return r
    return r + (xbar - xbar.to(r.dtype).to(xbar.dtype)).detach()


class _CopyToTPRegion(torch.autograd.Function):
    """f: identity forward (fan-out), all-reduce backward."""

    @staticmethod
    def forward(ctx, x, group, vocab, site):
        ctx.group, ctx.vocab, ctx.site = group, vocab, site
        return x.unsqueeze(0).expand(group.local, *x.shape)

    @staticmethod
    def backward(ctx, grad):
        # compiled, this backward runs no Python per step: copy_to_tp_region counted it when tracing the
        # forward
        nbytes = 0 if torch.compiler.is_compiling() else count_collective(ctx.group, "bwd", grad, ctx.vocab)
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
        with traced(group, "g", "fwd", site, count_collective(group, "fwd", x, vocab, compressed=compressed)):
            return group.sum_partials(x) if compressed else group.sum_shards(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.unsqueeze(0).expand(ctx.group.local, *grad.shape), None, None, None


def copy_to_tp_region(x, group, *, vocab=False, site=None):
    """f: (N, C) replicated -> (L, N, C) on the shards; backward all-reduces the shards' gradients.
    vocab=True counts it with the vocab-parallel collectives instead of the residual-stream syncs.
    site: where it runs, (layer, block type, site name), for its trace label only (see traced)."""
    x = in_autocast_dtype(x)
    if group.traceable and torch.compiler.is_compiling() and torch.is_grad_enabled() and x.requires_grad:
        # the backward all-reduce to come
        count_collective(group, "bwd", x.unsqueeze(0).expand(group.local, *x.shape), vocab)
    return _CopyToTPRegion.apply(x, group, vocab, site)


def reduce_from_tp_region(x, group, *, vocab=False, site=None):
    """g: (L, N, C) partial results -> (N, C), their sum over all tp shards; backward identity."""
    return _ReduceFromTPRegion.apply(in_autocast_dtype(x), group, vocab, site)


class _Reduced(torch.autograd.Function):
    """An asynchronous g's result as g's output in autograd: forward passes the (N, C) buffer the all-reduce
    writes on (reading nothing: its data may still be on the way); backward is g's, the gradient fanned out to
    the (L, N, C) partial results."""

    @staticmethod
    def forward(ctx, x, reduced):
        ctx.local = x.shape[0]
        return reduced

    @staticmethod
    def backward(ctx, grad):
        return grad.unsqueeze(0).expand(ctx.local, *grad.shape), None


class AsyncReduction:
    """An all-reduce issued by reduce_from_tp_region_async, maybe still running. `value` is g's
    result, (N, C), already in autograd as g's output (backward: identity, fanned out to the partial
    results), but its data is there only once wait() has returned: real mode blocks until the
    all-reduce is done (simulated mode summed at issue). wait() returns value; waiting again does
    nothing. The wait is a trace span of its own."""

    def __init__(self, x, group, site, nbytes):
        self.group, self.site, self.nbytes = group, site, nbytes
        with traced(group, "g_async", "fwd", site, nbytes):  # the issue
            reduced, self.work = group.sum_partials_async(x.detach())
        if self.work is not None:
            # The buffer is written after this returns, by an in-place ATen write autograd forbids on a custom
            # Function's output: gloo's copy back of a CUDA tensor's sum (seen on an H100: "Output 0 of
            # _ReducedBackward is a view and its base ... has been modified inplace"), the compressed
            # exchanges' dequantized sum. The buffer's .data shares its storage but not its version counter:
            # the one place every late write goes unseen.
            reduced = reduced.data
        self.value, self.waited = _Reduced.apply(x, reduced), False

    def wait(self):
        if not self.waited:
            with traced(self.group, "g_async", "fwd", self.site, self.nbytes, waiting=True):
                if self.work is not None:  # real mode (simulated mode summed at issue)
                    self.group.wait(self.work)
            self.work, self.waited = None, True
        return self.value


def reduce_from_tp_region_async(x, group, *, site=None):
    """g issued without waiting: (L, N, C) partial results -> an AsyncReduction at once, whose wait()
    gives their sum over all tp shards (N, C); backward identity, as g. In real mode the all-reduce runs
    in the background until wait(), so work issued in between overlaps it. Counted as g (a forward
    all-reduce), and as asynchronous."""
    x = in_autocast_dtype(x)
    return AsyncReduction(x, group, site, count_collective(group, "fwd", x, overlapped=True,
                                                           compressed=group.codec is not None))


f, g = copy_to_tp_region, reduce_from_tp_region  # the names the literature uses


def _is_one_tensor_for_all_shards(grad):
    """True for the gradient g's backward produces: one (N, C) tensor expanded over the shards (stride 0)."""
    return grad.dim() > 0 and grad.stride(0) == 0


class _Delta(torch.autograd.Function):
    """d_i = r_i - xbar, (L, N, C), (N, C) -> (L, N, C): a fresh tensor (not a view) that a shard projection
    may accumulate into in place. Backward: xbar's gradient is minus the sum of d's gradient over all tp
    shards, `scale` times the sum over the local ones."""

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
