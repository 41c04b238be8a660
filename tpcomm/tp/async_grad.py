"""
f's backward all-reduce issued asynchronously (tp_async_grad, docs/overlap.md): f fused with the
column-parallel projection it feeds, its backward in Megatron-LM's order (the input-gradient GEMM,
the all-reduce issued, the weight-gradient GEMM while it runs, then the wait), and in real eager
mode the wait as a node of its own made early in the forward, so the autograd engine runs other
chunks' and modules' backward while the all-reduce is in flight. Megatron-LM's async
tensor-model-parallel all-reduce (its LinearWithGradAccumulationAndAsyncCommunication): every
gradient still leaves through autograd (AccumulateGrad, DDP's hooks, FSDP2's post-backward and the
pipeline stages see them as always); nothing writes p.grad.
"""

import torch

from tpcomm.tp.collectives import in_autocast_dtype
from tpcomm.tp.counting import count_collective, traced


LN_EPS = 1e-5  # model.LayerNorm's


class _Deferred:
    """The rest of a _FusedColumn backward (wait for the all-reduce, then what reads its result), run by the
    _AwaitGrads node that was created for it earlier in the forward: between them the engine runs other ready
    backward work (another batch chunk's, another module's) while the all-reduce is in flight."""

    def __init__(self, covered):
        self.finish, self.grads = None, None
        # which of (ln_w, ln_b, *parts) the _AwaitGrads node holds (the others are None)
        self.covered = covered
        # the node's output whose incoming gradient is the stream's (ColumnInput.stream)
        self.stream_at = None

    def result(self, incoming):
        if self.grads is None:
            stream_grad = None if self.stream_at is None else incoming[self.stream_at]
            self.grads, self.finish = self.finish(stream_grad), None
        return self.grads


class _AwaitGrads(torch.autograd.Function):
    """Identity forward on tensors that exist early (the stream's parts, the LayerNorm's parameters), so
    that its node's sequence number is low and the engine, which runs the ready node created last first,
    reaches it only after the other ready work. Backward: gives the real gradients once the all-reduce
    has completed (_Deferred.result), from the placeholders _FusedColumn returned plus, where the stream
    was formed from its outputs too (ColumnInput.stream), the stream's gradient, which joins f's there as
    the residual's does in the fused sum. Its outputs feed only that _FusedColumn and that sum, so the
    placeholders never reach a gradient accumulation."""

    @staticmethod
    def forward(ctx, link, *xs):
        ctx.link = link
        return tuple(x.view_as(x) for x in xs)

    @staticmethod
    def backward(ctx, *incoming):
        grads = ctx.link.result(incoming)
        return (None, *(grads[i] for i in ctx.link.covered))


def _one_dtype(x, w, b, *, autocast):
    """A LayerNorm's input and parameters in one dtype, as CUDA's kernel wants them (its CPU kernel takes a
    mix): float32 at least under autocast, whose fp32 list holds layer_norm (a bf16 stream or bf16
    FSDP2-gathered weights meet fp32 there), else the input's."""
    want = torch.promote_types(x.dtype, torch.float32) if autocast else x.dtype
    return tuple(None if t is None else t.to(want) for t in (x, w, b))


def _placeholder(t, dtype):
    """A gradient of t's shape, in dtype, that no one reads (stride 0: no memory)."""
    return torch.zeros((), dtype=dtype, device=t.device).expand(t.shape)


class _FusedColumn(torch.autograd.Function):
    """f and the column-parallel matmul it feeds, on the synced stream s = parts[0] + parts[1] + ... (N, C):
        norm 'before':  y = f(LN(s)) @ W + b      (LN with the synced parameters, once a replica)  -> (s?, y)
        norm 'fan_out': r = f(s), y = LN(r) @ W + b  (real: LN per rank; simulated: LN(ln_in) once)  -> (r, y)
    W (L, C, K), b (L, 1, K) or None, y (L, N, K). Backward in Megatron's order: the input-gradient GEMM (and,
    fan_out in real mode, the LayerNorm's backward and the residual's gradient: all of f's gradient), the
    all-reduce issued asynchronously, the weight-gradient GEMM, then the wait (inline, or in an _AwaitGrads
    node created earlier when `link` is given) and what reads the sum (the LayerNorm's backward, 'before').
    The same ops as the unfused path, in the same order, so the gradients are bitwise those of f + bmm."""

    @staticmethod
    def forward(ctx, group, norm, resid, site, link, W, b, ln_w, ln_b, ln_in, *parts):
        s = parts[0]
        for p in parts[1:]:
            s = s + p
        L, C = group.local, s.shape[-1]
        dt = torch.get_autocast_dtype(s.device.type) if torch.is_autocast_enabled(s.device.type) else None
        ln_dtypes = (None, *(None if t is None else t.dtype for t in (ln_w, ln_b)))
        with torch.autocast(s.device.type, enabled=False):
            r = None
            # f; the stream's own dtype (its value exactly, as fan_out_stream's): a bf16 copy
            if norm == "fan_out":
                r = s.unsqueeze(0).expand(L, *s.shape)  # would add tp times its rounding at the next sync
                # simulated: every shard's LN is LN(s), computed once
                ln_x = ln_in if ln_in is not None else r
            else:
                ln_x = s if norm == "before" else None
            if ln_x is not None:
                ln_dtypes = (ln_x.dtype, *ln_dtypes[1:])
                ln_x, ln_w, ln_b = _one_dtype(ln_x, ln_w, ln_b, autocast=dt is not None)
                h, mean, rstd = torch.native_layer_norm(ln_x, (C,), ln_w, ln_b, LN_EPS)
            else:
                h, mean, rstd = s, None, None
            if h.dim() == 2:
                h = h.unsqueeze(0).expand(L, *h.shape)  # f (or, simulated fan_out, LN(s) on every shard)
            if dt is not None:
                h, W, b = h.to(dt), W.to(dt), None if b is None else b.to(dt)
            y = torch.bmm(h, W) if b is None else torch.baddbmm(b, h, W)
        ctx.save_for_backward(W, h, ln_x, mean, rstd, ln_w, ln_b)
        ctx.group, ctx.norm, ctx.site, ctx.link, ctx.dt, ctx.ln_dtypes = (group, norm, site, link, dt,
                                                                          ln_dtypes)
        ctx.b_shape = None if b is None else b.shape
        ctx.part_shapes = [p.shape for p in parts]
        ctx.dtypes = (s.dtype, parts[0].dtype)
        if norm == "fan_out":
            return r, y
        # a fresh tensor, not an input returned as a view of itself (FSDP2 warns)
        if resid and len(parts) == 1:
            s = s.clone()
        return (s, y) if resid else y

    @staticmethod
    def backward(ctx, *grads):
        W, h, ln_x, mean, rstd, ln_w, ln_b = ctx.saved_tensors
        group, norm = ctx.group, ctx.norm
        grad_out = grads[0] if len(grads) == 2 else None  # of s (its residual use) or r
        grad_y = grads[-1]
        grad_h = grad_y.bmm(W.transpose(1, 2))  # the input-gradient GEMM, (L, N, C)
        ln_mask = [True, ln_w is not None and ctx.needs_input_grad[7],
                   ln_b is not None and ctx.needs_input_grad[8]]
        g_lnw = g_lnb = g_ln_in = None
        if norm == "fan_out":
            if group.real:  # LN ran after f on this rank: its gradient joins f's before the all-reduce
                g_ln, g_lnw, g_lnb = torch.ops.aten.native_layer_norm_backward(
                    grad_h.to(ln_x.dtype), ln_x, [ln_x.shape[-1]], mean, rstd, ln_w, ln_b, ln_mask)
                local = g_ln if grad_out is None else grad_out + g_ln
            else:  # LN(s) once: its gradient (the shards' summed) goes to ln_in, apart from f's
                g_ln_in, g_lnw, g_lnb = torch.ops.aten.native_layer_norm_backward(
                    grad_h.sum(0).to(ln_x.dtype), ln_x, [ln_x.shape[-1]], mean, rstd, ln_w, ln_b, ln_mask)
                local = grad_out
        else:
            local = grad_h
        if ctx.dt is not None:  # f's all-reduce moves the autocast dtype, as the unfused f's does
            local = local.to(ctx.dt)
        # issue the all-reduce of the input gradient (simulated: the sum over the shards, at once)
        nbytes = 0 if torch.compiler.is_compiling() else count_collective(group, "bwd", local)
        with traced(group, "f_async", "bwd", ctx.site, nbytes):
            total, work = group.sum_shards_async(local)
        # the weight-gradient GEMM while it runs (as the unfused path: baddbmm's backward)
        grad_W = h.transpose(1, 2).bmm(grad_y)
        grad_b = None if ctx.b_shape is None else grad_y.sum_to_size(ctx.b_shape)

        # stream_grad: the stream's, when formed apart from a deferred ColumnInput
        def finish(stream_grad=None):
            if work is not None:
                with traced(group, "f_async", "bwd", ctx.site, nbytes, waiting=True):
                    group.wait(work)
            g_s, gw, gb = total, g_lnw, g_lnb
            if norm == "before":  # f's sum is the gradient of LN(s)
                g_s, gw, gb = torch.ops.aten.native_layer_norm_backward(
                    total.to(ln_x.dtype), ln_x, [ln_x.shape[-1]], mean, rstd, ln_w, ln_b, ln_mask)
            resid_grad = grad_out if stream_grad is None else stream_grad
            if norm != "fan_out" and resid_grad is not None:  # s's residual use
                g_s = g_s + resid_grad
            g_s = g_s.to(ctx.dtypes[1])
            # the params'
            gw, gb = (None if g is None else g.to(d) for g, d in zip((gw, gb), ctx.ln_dtypes[1:]))
            return (gw, gb, *(g_s if shape == g_s.shape else g_s.sum_to_size(shape)
                              for shape in ctx.part_shapes))

        if ctx.link is None:
            deferred = finish()
        else:  # _AwaitGrads, created earlier in the forward, waits; until then these placeholders stand in
            ctx.link.finish = finish
            deferred = (*(None if t is None else _placeholder(t, d) for t,
                          d in zip((ln_w, ln_b), ctx.ln_dtypes[1:])),
                        *(torch.zeros((), dtype=ctx.dtypes[1], device=h.device).expand(shape)
                          for shape in ctx.part_shapes))
        gw, gb, *g_parts = deferred
        g_ln_in = None if g_ln_in is None else g_ln_in.to(ctx.ln_dtypes[0])
        return (None, None, None, None, None, grad_W, grad_b, gw, gb, g_ln_in, *g_parts)


class ColumnInput:
    """The input of a column-parallel projection fed through f whose backward all-reduce is asynchronous
    (tp_async_grad): the synced stream's parts (summed in order: x, a pending all-reduce's value, a bias) and
    the LayerNorm that runs on it. Made where those tensors exist; project() runs later. defer=True (real
    mode, eager, training): the wait is a node made here, so the engine runs the backward of what is computed
    between here and project() (another chunk, another module) while the all-reduce is in flight."""

    def __init__(self, group, parts, ln_w, ln_b, *, defer=False):
        self.group, self.parts, self.ln_w, self.ln_b, self.link = group, tuple(parts), ln_w, ln_b, None
        if defer and group.real and torch.is_grad_enabled() and not torch.compiler.is_compiling():
            held = (ln_w, ln_b, *self.parts)
            self.link = _Deferred([i for i, t in enumerate(held) if t is not None])
            out = list(_AwaitGrads.apply(self.link, *(t for t in held if t is not None)))
            self.ln_w = None if ln_w is None else out.pop(0)
            self.ln_b = None if ln_b is None else out.pop(0)
            self.parts = tuple(out)

    def stream(self):
        """The synced stream the parts sum to, formed apart from the projection, so that the projection's
        backward need not wait for the stream's readers' (project(resid=True) returns it from the
        projection). Deferred: formed from the _AwaitGrads node's outputs, so its gradient reaches that
        node and joins f's there, before the sum goes to the parts (the fused sum's order). Else the
        parts get the two gradients apart, summed where they accumulate: a broadcast part (a bias) must
        then be expanded to the stream's shape beforehand (tpcomm.tp.sharded_layers.full), so its two are
        summed before the sum over tokens; a single part's readers meet in a view of it first, as they
        met in resid's output. Both bit for bit resid's."""
        if self.link is not None:
            self.link.stream_at = len(self.link.covered) - len(self.parts)  # its first part's output
        # one part: a tensor of its own, where its readers' gradients meet
        s = self.parts[0].view_as(self.parts[0])
        for p in self.parts[1:]:
            s = s + p
        return s

    def project(self, W, b, *, norm, resid=False, site=None):
        """norm 'before' -> y, or (s, y) with resid; 'fan_out' -> (r, y); see _FusedColumn."""
        s0, group = self.parts[0], self.group
        # its backward all-reduce
        if group.traceable and torch.compiler.is_compiling() and torch.is_grad_enabled():
            count_collective(group, "bwd", in_autocast_dtype(s0).unsqueeze(0).expand(group.local, *s0.shape))
        parts, ln_in = self.parts, None
        if norm == "fan_out" and not group.real:  # LN(s) once; s passed twice (dynamo wants distinct tensors)
            parts, ln_in = (parts[0].view_as(parts[0]), *parts[1:]), parts[0]
        # compiled, real mode too: its all-reduce is a functional collective inside the graph
        # (RealTP.traceable)
        return _FusedColumn.apply(group, norm, resid, site, self.link, W, b, self.ln_w, self.ln_b, ln_in,
                                  *parts)
