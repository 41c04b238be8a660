"""
The pipeline schedule as it ran: a Recorder notes each stage's forwards, backwards and transfers
(RecordedStage, a torch PipelineStage that reports to it); replay orders the recorded actions in time,
bubble_fraction and theoretical_bubble measure the idle share, format_timeline and format_events print
them (tpcomm/parallel/pipeline.py runs the schedule; bench.py --mode=pipeline and
tpcomm/bench/pipeline_demo.py show these).
"""

from torch.distributed.pipelining import PipelineStage


class Recorder:
    """This rank's actions in one step, in the order they ran: ('F'|'B', stage, micro_batch, 0) computations,
    and ('send_act'|'recv_act'|'send_grad'|'recv_grad', stage, micro_batch, bytes) point-to-point transfers as
    the schedule posts them. Before each forward it keys the model's dropout masks by the micro-batch."""

    def __init__(self, model):
        self.model, self.events, self.dropout_key = model, [], None

    def start(self, dropout_key):
        self.events, self.dropout_key = [], dropout_key

    def forward(self, stage, mb):
        # (seed, iteration, global index of this replica's first micro-batch)
        if self.dropout_key is not None:
            seed, iteration, first = self.dropout_key
            self.model.seed_dropout(seed, iteration, first + mb)
        self.events.append(("F", stage, mb, 0))

    def transfer(self, kind, stage, mb, ops):
        if ops:
            self.events.append((kind, stage, mb, sum(op.tensor.numel() * op.tensor.element_size()
                                                     for op in ops)))
        return ops


class RecordedStage(PipelineStage):
    """torch's PipelineStage, telling a Recorder what the schedule makes it do."""

    def __init__(self, *args, recorder, **kwargs):
        super().__init__(*args, **kwargs)
        self.recorder = recorder

    def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
        self.recorder.forward(self.stage_index, fwd_chunk_id)
        return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)

    def backward_one_chunk(self, bwd_chunk_id, *args, **kwargs):
        self.recorder.events.append(("B", self.stage_index, bwd_chunk_id, 0))
        return super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)

    def get_fwd_recv_ops(self, chunk):
        return self.recorder.transfer("recv_act", self.stage_index, chunk, super().get_fwd_recv_ops(chunk))

    def get_fwd_send_ops(self, chunk):
        return self.recorder.transfer("send_act", self.stage_index, chunk, super().get_fwd_send_ops(chunk))

    def get_bwd_recv_ops(self, chunk):
        return self.recorder.transfer("recv_grad", self.stage_index, chunk, super().get_bwd_recv_ops(chunk))

    def get_bwd_send_ops(self, chunk):
        return self.recorder.transfer("send_grad", self.stage_index, chunk, super().get_bwd_send_ops(chunk))


def replay(actions):
    """Slots of a recorded timeline. actions: {pp_rank: [('F'|'B', stage, mb), ...]} in the order each rank
    ran them. Every forward and backward of one stage on one micro-batch takes one slot; an action starts when
    its rank is free and its inputs exist: F(s, m) after F(s-1, m), B(s, m) after F(s, m) and B(s+1, m).
    Returns {pp_rank: [(slot, action)]} and the number of slots. (With equal stages the GPipe/1F1B bubble
    fraction does not depend on the backward/forward cost ratio, so one slot each loses nothing there.)"""
    n_stages = 1 + max(s for acts in actions.values() for _, s, _ in acts)
    done, pos, free, slots = {}, {r: 0 for r in actions}, {r: 0 for r in actions}, {r: [] for r in actions}
    progress = True
    while progress:
        progress = False
        for r, acts in actions.items():
            while pos[r] < len(acts):
                kind, s, m = acts[pos[r]]
                deps = ([("F", s - 1, m)] if s > 0 else []) if kind == "F" else \
                    [("F", s, m)] + ([("B", s + 1, m)] if s < n_stages - 1 else [])
                if any(d not in done for d in deps):
                    break
                start = max([free[r]] + [done[d] for d in deps])
                done[(kind, s, m)] = free[r] = start + 1
                slots[r].append((start, (kind, s, m)))
                pos[r] += 1
                progress = True
    if any(pos[r] < len(acts) for r, acts in actions.items()):
        raise ValueError("the timeline waits on an action that never runs")
    return slots, max(done.values())


def bubble_fraction(actions):
    """Idle slots over all slots (pp ranks x makespan) of the replayed timeline."""
    slots, makespan = replay(actions)
    return 1.0 - sum(len(s) for s in slots.values()) / (len(slots) * makespan)


def theoretical_bubble(pp, m, virtual_stages=1):
    """(p-1)/(v m + p-1): GPipe and 1F1B at v = 1; interleaved 1F1B with v stages per rank (Megatron-LM's
    (p-1)/(v m) bubble over ideal time, as a fraction of the total)."""
    return (pp - 1) / (virtual_stages * m + pp - 1)


def format_timeline(actions, pp):
    """One row per pp rank, one cell per slot: F3 / B3 forward / backward of micro-batch 3 ('F3.1': the rank's
    virtual stage 1), '.' idle."""
    slots, makespan = replay(actions)
    multi = any(s >= pp for acts in actions.values() for _, s, _ in acts)

    def label(kind, s, m):
        return f"{kind}{m}" + (f".{s // pp}" if multi else "")

    width = 1 + max(len(label(*a)) for acts in actions.values() for a in acts)
    rows = []
    for r in sorted(slots):
        cells = ["."] * makespan
        for start, a in slots[r]:
            cells[start] = label(*a)
        rows.append(f"pp{r} " + "".join(c.rjust(width) for c in cells))
    return "\n".join(rows)


def format_events(events, pp):
    """A rank's recorded events in order: F3/B3 computations, >a3 / <a3 activations of micro-batch 3 sent /
    received, >g3 / <g3 gradients."""
    arrows = {"send_act": ">a", "recv_act": "<a", "send_grad": ">g", "recv_grad": "<g"}
    multi = any(s >= pp for _, s, _, _ in events)
    return " ".join(f"{arrows.get(k, k)}{m}" + (f".{s // pp}" if multi else "") for k, s, m, _ in events)


# ---------------------------------------------------------------- this rank's part of the pipeline
