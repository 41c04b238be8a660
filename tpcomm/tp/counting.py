"""
Counting and labelling the tensor-parallel collectives: every f, g, sequence-parallel and vocab-parallel
collective is counted where it runs (CommCounter, one per group), so communication is measured, not computed.

While a profiler records (torch.profiler; tpcomm.bench.trace), every collective also runs inside a
torch.profiler.record_function span named for a trace (tpcomm.bench.trace.collective_events parses it back):

    allreduce <op> <fwd|bwd>[ L<layer> <block type>] <site> <bytes>B <sim|real>
    e.g.  allreduce g fwd L3 spd mlp 24576B real      allreduce f bwd L0 tp attn 24576B sim

op: f (its backward all-reduce), g (its forward all-reduce), g_async (g issued without waiting: the span
covers the issue; the wait for its result is a span of its own, the same label after 'wait ', e.g. `wait
allreduce g_async fwd L3 ladder attn 24576B real`), max / sum (the vocab-parallel loss, the gradient syncs).
site: attn or mlp inside a block (an 'spd' block's one all-reduce closes its MLP), final_sync (before ln_f),
vocab_embed / vocab_head / vocab_loss (loss_parallel), grad_sync (real mode: the block-replicated gradients,
once per step) and grad_norm (real mode: the clipping norm's scalar). Bytes: the tensor each rank contributes,
as counted. Simulated TP has no real collective, but its sum over the shard dimension is the all-reduce: it is
recorded too (sim). With no profiler recording nothing is formatted (one flag is read).
"""

import contextlib
import time

import torch

# sequence parallelism's collectives, counted apart from the all-reduces: reduce-scatter and all-gather, and
# the peer-to-peer transfers of collective matmul's rings (tpcomm/tp/collective_matmul.py), one count per
# transfer
RS, AG, P2P = "rs", "ag", "p2p"
SP_LABEL = {RS: "reduce_scatter", AG: "all_gather", P2P: "ring_p2p"}


class CommCounter:
    """Collectives counted by f and g: how many, and their payload (the tensor each rank contributes)."""

    COMPILED = ("fwd", "fwd_bytes", "bwd", "bwd_bytes", "vocab", "vocab_bytes", "async", "compressed",
                "compressed_bytes")  # the slots of the tensor compiled code counts into (see add)

    def __init__(self):
        self.reset()

    def reset(self):
        self.fwd = self.bwd = self.grad_sync = 0
        self.fwd_bytes = self.bwd_bytes = 0
        self.overlapped = 0  # of the fwd ones: issued asynchronously (reduce_from_tp_region_async)
        # of the fwd ones: block-quantized (tp_comm_dtype), their bytes
        self.compressed = self.compressed_bytes = 0
        # the vocab-parallel embedding and loss, counted apart (loss_parallel)
        self.vocab = self.vocab_bytes = 0
        # RealTP only, per direction (fwd: the forward pass; bwd: inside backward, and the per-step gradient
        # syncs). exposed: the time the compute waits in collectives (waiting for the other ranks included): a
        # blocking one's call, an asynchronous one's issue plus the time its wait() blocked. busy: how long
        # the collectives ran, from issue to completion (a callback on the work's future), the compute they
        # overlapped included; busy >= exposed by construction (see Timing). codec: tp_comm_dtype's
        # quantize/dequantize/sum around the compressed exchanges, counted in neither. Times are marks of a
        # Clock: wall time on CPU, CUDA events on CUDA, read (add_timing) when the marks are ready, at the
        # latest when the counter is reported.
        self.exposed = {"fwd": 0.0, "bwd": 0.0}
        self.busy = {"fwd": 0.0, "bwd": 0.0}
        self.codec_seconds = 0.0
        self.unread = []  # Timings whose marks are not read yet (device clocks)
        # what torch.compile'd code counted (see add), one slot per name of COMPILED
        self.compiled = torch.zeros(len(self.COMPILED), dtype=torch.int64)
        # sequence parallelism's reduce-scatters and all-gathers, counted apart from the all-reduces (add_sp):
        # [count, bytes] per (direction, kind), kind 'rs' or 'ag'; compiled code counts into compiled_sp
        self.sp = {(d, k): [0, 0] for d in ("fwd", "bwd") for k in (RS, AG, P2P)}
        self.compiled_sp = torch.zeros(2 * len(self.sp), dtype=torch.int64)

    @property
    def seconds(self):
        """Exposed communication, both directions (see reset)."""
        self.read_timings()
        return self.exposed["fwd"] + self.exposed["bwd"]

    @property
    def busy_seconds(self):
        """Time in collectives, both directions (see reset)."""
        self.read_timings()
        return self.busy["fwd"] + self.busy["bwd"]

    def add_timing(self, timing):
        """One collective's Timing: read now (a host clock), or once its marks are ready (a device
        clock: reading an event before the device reached it would synchronize the host). A device
        clock's unread timings are read when reported, or, past UNREAD_LIMIT of them, those already
        complete (no synchronization)."""
        if not timing.clock.lazy:
            return self.account(timing)
        self.unread.append(timing)
        if len(self.unread) > self.UNREAD_LIMIT:
            ready = [t for t in self.unread if t.ready()]
            self.unread = [t for t in self.unread if not any(t is r for r in ready)]
            for t in ready:
                self.account(t)

    UNREAD_LIMIT = 4096

    def read_timings(self):
        """Read every unread timing (a device clock synchronizes with the events here, once per report)."""
        unread, self.unread = self.unread, []
        for t in unread:
            self.account(t)

    def account(self, timing):
        if timing.codec:
            self.codec_seconds += timing.busy()
            return
        self.exposed[timing.direction] += timing.exposed()
        self.busy[timing.direction] += timing.busy()

    def add(self, direction, nbytes, *, vocab=False, overlapped=False, compressed=False):
        """Count one collective (overlapped: a forward one issued asynchronously; compressed: a forward one
        moved block-quantized, nbytes its compressed payload, scales included). Inside torch.compile'd code
        Python counts would make dynamo guard on their values (and trace again every step), so there the
        counts go into a tensor that the graph updates in place."""
        if torch.compiler.is_compiling():
            kind = "vocab" if vocab else direction
            step = {kind: 1, f"{kind}_bytes": nbytes, "async": int(overlapped), "compressed": int(compressed),
                    "compressed_bytes": nbytes if compressed else 0}
            self.compiled.add_(torch.tensor([step.get(name, 0) for name in self.COMPILED]))
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
        """Count one reduce-scatter (kind 'rs') or all-gather ('ag') of sequence parallelism; nbytes: the
        whole (N, C) buffer, a reduce-scatter's input or an all-gather's output (see _count_sp)."""
        if torch.compiler.is_compiling():
            slot = 2 * list(self.sp).index((direction, kind))
            self.compiled_sp.add_(torch.tensor([1 if i == slot else nbytes if i == slot + 1 else 0
                                                for i in range(len(self.compiled_sp))]))
            return
        entry = self.sp[direction, kind]
        entry[0], entry[1] = entry[0] + 1, entry[1] + nbytes

    def sp_report(self, n, tokens):
        """The reduce-scatters and all-gathers per pass ({} when there were none),
        keyed apart from all-reduces."""
        c = self.compiled_sp.tolist()
        counts = {dk: (v[0] + c[2 * i], v[1] + c[2 * i + 1]) for i, (dk, v) in enumerate(self.sp.items())}
        if not any(count for count, _ in counts.values()):
            return {}
        names = {RS: "reduce_scatters", AG: "all_gathers", P2P: "ring_transfers"}
        out = {f"{d}_{names[k]}": count // n for (d, k), (count, _) in counts.items() if k != P2P}
        out["sp_bytes_per_token"] = sum(b for (_, k), (_, b) in counts.items() if k != P2P) / (n * tokens)
        ring = {d: counts[d, P2P] for d in ("fwd", "bwd")}
        if any(count for count, _ in ring.values()):  # collective matmul: what each rank sent, step by step
            out.update({f"{d}_ring_transfers": count // n for d, (count, _) in ring.items()})
            out["ring_bytes_per_token"] = sum(b for _, b in ring.values()) / (n * tokens)
        return out

    def report(self, *, micro_steps, tokens):
        """Per forward/backward pass (one micro-batch of `tokens` tokens); gradient syncs per optimizer step.
        The residual-stream syncs (fwd/bwd_allreduces) never include the vocab-parallel collectives, reported
        apart. async_allreduces: how many of the fwd_allreduces were issued asynchronously, free to overlap
        the compute that follows them (real mode overlaps them; simulated mode sums at once, and counts them
        alike). With sequence parallelism: fwd_reduce_scatters, fwd_all_gathers, bwd_reduce_scatters,
        bwd_all_gathers and sp_bytes_per_token (their whole-buffer bytes), none of them in the all-reduce
        keys. With collective matmul (tp_collective_matmul): fwd_ring_transfers, bwd_ring_transfers and
        ring_bytes_per_token (what a rank sent). With tp_comm_dtype: compressed_allreduces (how many
        fwd_allreduces moved block-quantized) and compressed_bytes_per_token (their compressed bytes, scales
        included, also in comm_bytes_per_token). Times (real TP; seconds since reset, all passes together):
        comm_seconds exposed and comm_busy_seconds in collectives, both directions; comm_fwd_seconds /
        comm_bwd_seconds and comm_fwd_busy_seconds / comm_bwd_busy_seconds per direction; comm_codec_seconds
        (tp_comm_dtype) the quantize/dequantize work."""
        n = max(1, micro_steps)
        c = dict(zip(self.COMPILED, self.compiled.tolist()))
        fwd, fwd_bytes = self.fwd + c["fwd"], self.fwd_bytes + c["fwd_bytes"]
        bwd, bwd_bytes = self.bwd + c["bwd"], self.bwd_bytes + c["bwd_bytes"]
        vocab, vocab_bytes = self.vocab + c["vocab"], self.vocab_bytes + c["vocab_bytes"]
        out = dict(fwd_allreduces=fwd // n, bwd_allreduces=bwd // n,
                   async_allreduces=(self.overlapped + c["async"]) // n,
                   grad_sync_allreduces=self.grad_sync,
                   comm_bytes_per_token=(fwd_bytes + bwd_bytes) / (n * tokens), comm_seconds=self.seconds,
                   comm_busy_seconds=self.busy_seconds,
                   comm_fwd_seconds=self.exposed["fwd"], comm_bwd_seconds=self.exposed["bwd"],
                   comm_fwd_busy_seconds=self.busy["fwd"], comm_bwd_busy_seconds=self.busy["bwd"])
        # tp_comm_dtype under real TP: quantize, dequantize and sum, outside both times
        if self.codec_seconds:
            out.update(comm_codec_seconds=self.codec_seconds)
        if vocab:
            out.update(vocab_allreduces=vocab // n, vocab_bytes_per_token=vocab_bytes / (n * tokens))
        compressed = self.compressed + c["compressed"]
        compressed_bytes = self.compressed_bytes + c["compressed_bytes"]
        # tp_comm_dtype: these fwd all-reduces moved compressed; their bytes are in comm_bytes too
        if compressed:
            out.update(compressed_allreduces=compressed // n,
                       compressed_bytes_per_token=compressed_bytes / (n * tokens))
        # sequence parallelism: fwd/bwd_reduce_scatters, _all_gathers, bytes
        out.update(self.sp_report(n, tokens))
        return out



class WallClock:
    """Host time (perf_counter). Right where the host runs the collective (gloo on CPU tensors: the call
    blocks until done, and an asynchronous one's future completes on gloo's thread when it is done)."""

    lazy = False

    def now(self):
        return time.perf_counter()

    def seconds(self, a, b):
        return b - a

    def ready(self, mark):
        return True


class CudaEventClock:
    """Device time: a mark is a CUDA event recorded on the current stream, so an interval is what the stream
    spent between two points, not when the host queued them (NCCL returns once the work is queued). Events are
    read lazily (CommCounter.add_timing): no synchronization per collective. A completion mark taken in a
    callback of the work's future is recorded on the stream the future sets current there, which waits for the
    collective's kernels (torch.futures: CUDA futures run callbacks on streams synchronized with the work)."""

    lazy = True

    def now(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, a, b):
        b.synchronize()
        return a.elapsed_time(b) / 1e3

    def ready(self, mark):
        return mark.query()


WALL_CLOCK = WallClock()


def direction_now():
    """'bwd' while the autograd engine runs a backward pass (f's backward all-reduce), else 'fwd'."""
    return "bwd" if torch._C._current_graph_task_id() != -1 else "fwd"


class Timing:
    """One collective's marks on `clock`: start (called), issued (the call returned), done (completed: an
    asynchronous one's future callback; None where unknown) and waited (w0, w1) around the wait for an
    asynchronous one. With every mark read relative to start:
        exposed = issued + (w1 - w0)                          the compute held up in the call and the wait
        busy    = the length of [0, max(issued, done)] U [w0, w1]   in flight, issue to completion; the calls
    so exposed <= busy always. Without a done mark, an awaited collective counts as running until its wait
    ended. codec=True: not a collective, the codec's work (start to issued)."""

    __slots__ = ("clock", "direction", "start", "issued", "done", "waited", "codec")

    def __init__(self, clock, direction, start, issued, *, done=None, waited=None, codec=False):
        self.clock, self.direction, self.start, self.issued = clock, direction, start, issued
        self.done, self.waited, self.codec = done, waited, codec

    def marks(self):
        return [m for m in (self.issued, self.done, *(self.waited or ())) if m is not None]

    def ready(self):
        return all(self.clock.ready(m) for m in self.marks())

    def _rel(self, mark):
        return None if mark is None else self.clock.seconds(self.start, mark)

    def exposed(self):
        waited = self.waited and self.clock.seconds(*self.waited)
        return self._rel(self.issued) + (waited or 0.0)

    def busy(self):
        issued, done = self._rel(self.issued), self._rel(self.done)
        end = issued if done is None else max(issued, done)
        if not self.waited:
            return end
        w0, w1 = self._rel(self.waited[0]), self._rel(self.waited[1])
        if self.done is None or w0 <= end:
            return max(end, w1)
        return end + (w1 - w0)


def count_collective(group, direction, t, vocab=False, overlapped=False, compressed=False):
    """Count a collective of t (L, ...) and return the bytes each rank contributes (0: one rank,
    nothing moves); compressed: g's partial sums block-quantized by group.codec, counted as their
    payload, scales included."""
    if group.tp > 1:  # a collective over one rank moves nothing (Megatron skips it)
        values = t.numel() // group.local
        nbytes = group.codec.payload_bytes(values) if compressed else values * t.element_size()
        group.counter.add(direction, nbytes, vocab=vocab, overlapped=overlapped, compressed=compressed)
        return nbytes
    return 0



def count_sp(group, direction, kind, nbytes):
    """Count a reduce-scatter or all-gather of nbytes (the whole (N, C) buffer per rank: a reduce-scatter's
    input, an all-gather's output); returns nbytes (0 at one rank: nothing moves)."""
    if group.tp == 1:
        return 0
    group.counter.add_sp(direction, kind, nbytes)
    return nbytes


def whole_bytes(group, x):
    """Bytes of the whole (N, C) stream that x, a token shard (N/tp, C) (simulated: the whole), is part of."""
    return x.numel() * x.element_size() * (group.tp if group.real else 1)


def nbytes(x):
    return x.numel() * x.element_size()


def backward_count(group, kind, nbytes):
    """The count of a backward collective: in Python when backward runs; compiled code runs no Python there,
    so the wrapper counted it when the forward was traced (count_when_compiling)."""
    return 0 if torch.compiler.is_compiling() else count_sp(group, "bwd", kind, nbytes)


def count_when_compiling(group, x, kind, nbytes):
    if group.traceable and torch.compiler.is_compiling() and torch.is_grad_enabled() and x.requires_grad:
        count_sp(group, "bwd", kind, nbytes)



# Where a collective runs, for its trace label: (layer or None, block type or None, site). Blocks pass their
# own (ShardedBlock.sites); these are the model-level ones.
FINAL_SYNC, OTHER = (None, None, "final_sync"), (None, None, "other")
VOCAB_EMBED, VOCAB_HEAD = (None, None, "vocab_embed"), (None, None, "vocab_head")
VOCAB_LOSS = (None, None, "vocab_loss")
GRAD_SYNC, GRAD_NORM = (None, None, "grad_sync"), (None, None, "grad_norm")
_NOT_RECORDED = contextlib.nullcontext()  # stateless: one instance serves every untraced collective


def traced(group, op, direction, site, nbytes, *, waiting=False, collective="allreduce"):
    """A profiler span labelled for this collective while a profiler records (see the module docstring), else
    a context that does nothing: the label is formatted only while tracing. Not inside torch.compile'd code.
    waiting=True: the span of the wait for an asynchronous one ('wait ' before its label)."""
    if group.tp == 1 or torch.compiler.is_compiling() or not torch.autograd.profiler._is_profiler_enabled:
        return _NOT_RECORDED
    layer, block, where = site or OTHER
    at = "" if layer is None else f" L{layer} {block}"
    label = f"{collective} {op} {direction}{at} {where} {nbytes}B {'real' if group.real else 'sim'}"
    return torch.profiler.record_function(f"wait {label}" if waiting else label)
