"""
The compressed exchanges of g's partial sums under real TP (tp_comm_dtype; the codec and the simulated
sums: tpcomm/tp/compress/compression.py). Both are issued without waiting and return (the (N, C) buffer
of the sum, a work to wait on):

    one_shot  an all-gather of every rank's packed partial sum; wait() dequantizes and sums them in rank order
    two_shot  an all-to-all of packed row chunks (a reduce-scatter); wait() sums this rank's chunk,
              all-gathers it packed again and dequantizes every chunk into the buffer

Timing (tpcomm/tp/counting.py): the collectives themselves are exposed/busy time as every collective's; the
codec's work around them (pack, unpack, sum) is counted apart as codec seconds, in neither, so exposed <= busy
holds here too (the dequantize and sum inside wait() are compute, not exposed communication).
"""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

# torch 2.13 named these two *_single (PyTorch PR 186123) and kept the older names, all_gather_into_tensor and
# reduce_scatter_tensor, as deprecated aliases; torch 2.12 and older have only the older names.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def one_shot_async(group, x):
    """(1, N, C) -> ((N, C), work): an all-gather of every rank's packed partial sum (uint8: scales, then
    values) issued now; the (N, C) buffer holds the sum of the dequantized partials, in rank order, once
    group.wait(work) has returned."""
    with group.codec_time(x):
        payload = group.codec.pack(x[0])
    gathered = payload.new_empty(group.tp * payload.numel())  # every rank's payload, rank order
    clock = group.clock_for(x)
    start = clock.now()
    work = group.in_flight(all_gather_single(gathered, payload, group=group.group, async_op=True), start,
                           clock)
    out = x.new_empty(x.shape[1:])
    return out, _Decompress(group, work, gathered.view(group.tp, -1), out)


def two_shot_async(group, x):
    """The two_shot exchange of (1, N, C) partial sums (tpcomm.tp.compress.compression): the rows in tp chunks
    of ceil(N/tp) (zero-padded), chunk j of every rank's packed partial sent to rank j by an all-to-all issued
    now; wait(work) sums the dequantized chunks, all-gathers that sum packed again and writes all of it into
    the (N, C) buffer returned. The all-gather runs inside wait: exposed, while the all-to-all may overlap."""
    rows = x[0].reshape(-1, x.shape[-1])
    per = -(-rows.shape[0] // group.tp)
    padded = torch.nn.functional.pad(rows, (0, 0, 0, per * group.tp - rows.shape[0]))
    with group.codec_time(x):
        # (tp, chunk payload): chunk j goes to rank j
        send = group.codec.pack_each(padded.view(group.tp, per, -1))
    # the buffers a collective writes are not views (torch.compile: a compiled region's output viewed, then
    # written in place, is refused)
    recv = send.new_empty(send.numel())
    clock = group.clock_for(x)
    start = clock.now()
    work = group.in_flight(dist.all_to_all_single(recv, send.reshape(-1), group=group.group, async_op=True),
                           start, clock)
    out = x.new_empty(x.shape[1:])
    return out, _TwoShot(group, work, recv.view(group.tp, -1), out, per)


def compiled(group, x):
    """The exchange of (1, N, C) partial sums -> their (N, C) sum under torch.compile: the same packing,
    collectives and sums as one_shot_async / two_shot_async and their waits, with functional collectives
    (traced into the graph, no buffer written in place)."""
    codec, tp, g = group.codec, group.tp, group.group
    if codec.exchange != "two_shot":
        payload = codec.pack(x[0])
        gathered = funcol.wait_tensor(funcol.all_gather_tensor(payload, 0, g))
        return codec.unpack(gathered.view(tp, -1), x.shape[1:], x.dtype).sum(0)
    rows = x[0].reshape(-1, x.shape[-1])
    per = -(-rows.shape[0] // tp)
    padded = torch.nn.functional.pad(rows, (0, 0, 0, per * tp - rows.shape[0]))
    send = codec.pack_each(padded.view(tp, per, -1)).reshape(-1)
    recv = funcol.wait_tensor(funcol.all_to_all_single(send, None, None, g))
    shape = (per, x.shape[-1])
    mine = codec.unpack(recv.view(tp, -1), shape, x.dtype).sum(0)
    gathered = funcol.wait_tensor(funcol.all_gather_tensor(codec.pack(mine), 0, g))
    out = codec.unpack(gathered.view(tp, -1), shape, x.dtype).reshape(-1, shape[1])
    return out[:rows.shape[0]].view(x.shape[1:])


class _Decompress:
    """The work of a compressed sum_partials_async: wait() waits for the all-gather into `gathered` (tp,
    payload bytes), then writes the sum of the dequantized partials into `out` (the buffer g's result already
    is); that last part is codec time."""

    def __init__(self, group, work, gathered, out):
        self.group, self.work, self.gathered, self.out = group, work, gathered, out

    def wait(self):
        self.work.wait()
        # a write after issue, as an all-reduce's own: g's output is out's .data (AsyncReduction), so autograd
        # does not see it, and nothing reads that output before this wait
        with self.group.codec_time(self.out):
            self.out.copy_(self.group.codec.unpack(self.gathered, self.out.shape, self.out.dtype).sum(0))


class _TwoShot:
    """The work of a two_shot sum_partials_async: wait() waits for the all-to-all of the packed row
    chunks into `recv` (tp, chunk payload), sums this rank's chunk dequantized, all-gathers it packed
    again (blocking: exposed and busy) and writes every rank's chunk, dequantized, into `out` (the sums,
    packing and unpacking: codec time)."""

    def __init__(self, group, work, recv, out, per):
        self.group, self.work, self.recv, self.out, self.per = group, work, recv, out, per

    def wait(self):
        self.work.wait()
        g, codec, shape = self.group, self.group.codec, (self.per, self.out.shape[-1])
        with g.codec_time(self.out):
            # this rank's rows of the sum, rank order
            mine = codec.unpack(self.recv, shape, self.out.dtype).sum(0)
            payload = codec.pack(mine)
        gathered = payload.new_empty(g.tp * payload.numel())
        clock = g.clock_for(self.out)
        start = clock.now()
        all_gather_single(gathered, payload, group=g.group)
        g.blocked(start, clock)
        with g.codec_time(self.out):
            rows = codec.unpack(gathered.view(g.tp, -1), shape, self.out.dtype).reshape(-1, shape[1])
            self.out.copy_(rows[:self.out.numel() // shape[1]].view(self.out.shape))  # as _Decompress writes

