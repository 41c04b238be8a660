"""
The experiment's ways of giving up a sync, one entry each: what every output calls it, the model it
trains (block pattern and sync options), its category, how the cost model prices it, and whether cpu-long
trains it. The sweep plan (tpcomm/experiments/sweep_plan.py), the cost model
(tpcomm/costmodel/cost_model.py), gpu-node, the README's answer and every figure read this table; adding
a way is one entry (docs/experiments.md, "Adding a way"; tests/model/test_ways.py adds a throwaway one
and finds it in the plan, the prediction and the answer).

Consumers read `ways.WAYS` when called (never a copy taken at import), so a test can
add a way with monkeypatch.
"""

from typing import Callable, NamedTuple

CATEGORIES = ("baseline", "drop", "hide", "delay", "shrink", "drop + shrink")
# the cost model's terms (cost_model.train_variants prices each): 'baseline' all 'tp' (Megatron's backward, or
# blocking); 'drop' N forward syncs of the way's pattern, compressed when its sync options say tp_comm_dtype;
# 'overlap' tp_overlap chunks; 'sequence parallel' reduce-scatter + all-gather; 'collective matmul' SP's
# collectives as rings; 'delay' the ladder's forward all-reduces one module late, 'delay both' the backward
# ones too; 'compress' every all-reduce of all 'tp' at the way's tp_comm_dtype and tp_comm_exchange; 'partial
# sync' all 'caat'
TERMS = ("baseline", "drop", "overlap", "sequence parallel", "collective matmul", "delay", "delay both",
         "compress", "partial sync")


class Price(NamedTuple):
    """How the cost model prices a way: one of its TERMS, and the name its tables give the result
    (train_variants' key; '{chunks}' is filled with the tp_overlap chunk count the prediction assumes)."""
    term: str
    label: str


class Node(NamedTuple):
    """The way as gpu-node times it: its row name and description, the sync options it runs with when they
    differ from the way's (None: the way's), and blocking=True to price it with every sync blocking
    (cost_model.step_seconds)."""
    name: str
    what: str
    sync: dict = None
    blocking: bool = False


class Way(NamedTuple):
    # its run name (sweeps, result files, readings.pattern_name) and its key in every figure: 'all-spd'
    key: str
    category: str  # one of CATEGORIES
    what: str  # the README answer's spelling (markdown); the figures' name is it without backticks
    blocks: Callable  # block_types of n layers
    sync: dict = {}  # the sync options (model/options.TP_COMM_OPTIONS) it sets
    price: Price = None  # how the cost model prices it; None: not priced
    # cpu-long trains it with the first `seeds` of its seeds; 0: not trained (e.g. all 'tp''s math)
    seeds: int = 0
    answer: bool = True  # a row of the README's answer (and a point of its figure when priced)
    node: Node = None  # gpu-node's row; None: not timed there
    style: tuple = None  # (colour, marker) in every figure; None: drawn as a pattern that is no way (grey)

    @property
    def name(self):
        """The figures' name: the answer's spelling without its backticks."""
        return self.what.replace("`", "")


def _tp(n):
    return ["tp"] * n


def _spd(n):
    return ["spd"] * n


def tracks(D):
    """Tracks that sync every D blocks (the Parallel Track Transformer, arXiv 2602.07306): each shard's stream
    runs on its own through D-1 'parallel' blocks, one 'spd' block syncs it:
    (['parallel']*(D-1)+['spd'])*(n/D)."""
    return lambda n: ["spd" if i % D == D - 1 else "parallel" for i in range(n)]


def _caat(n):
    return ["caat"] * n


def _ladder(n):
    return ["ladder"] * n


# colours by family: drop red/orange/brown, hide green/olive, delay blue, shrink purple/pink, drop + shrink
# grey. Order: the README answer's rows, gpu-node's rows and the cost model's tables list them in this order.
WAYS = (
    Way("all-tp", "baseline", "all `tp`", _tp, price=Price("baseline", "all tp"), seeds=11, answer=False,
        node=Node("all tp", "baseline: every sync, blocking"), style=("black", "o")),  # GPT: every sync
    Way("all-tp-async", "baseline", "all `tp`, asynchronous backward", _tp, {"tp_async_grad": True},
        Price("baseline", "all tp"), answer=False,
        node=Node("all tp async", "baseline as Megatron runs it: each backward all-reduce beside its "
                  "weight-gradient GEMM")),
    Way("all-spd", "drop", "all `spd`", _spd, price=Price("drop", "all spd"), seeds=11,
        node=Node("all spd", "drop: one sync per block"), style=("#d62728", "o")),
    Way("parallel-spd", "drop", "tracks D=2 `['parallel','spd']*6`", tracks(2),
        price=Price("drop", "parallel/spd"), seeds=10, node=Node("parallel/spd", "drop: one sync per two "
                                                                 "blocks"),
        style=("#ff7f0e", "s")),
    Way("parallel2-spd", "drop", "tracks D=3 `(['parallel']*2+['spd'])*4`", tracks(3),
        price=Price("drop", "tracks/3"), seeds=3, answer=False, style=("#fdae6b", "<")),
    Way("all-parallel", "drop", "all `parallel`", lambda n: ["parallel"] * n,
        price=Price("drop", "all parallel"),
        seeds=10, node=Node("all parallel", "drop: one sync in all", blocking=True), style=("#8c564b", "^")),
    Way("parallel3-spd", "drop", "tracks D=4 `(['parallel']*3+['spd'])*3`", tracks(4),
        price=Price("drop", "tracks/4"), seeds=10, node=Node("tracks/4", "drop: one sync every 4 blocks"),
        style=("#fd8d3c", ">")),
    Way("parallel5-spd", "drop", "tracks D=6 `(['parallel']*5+['spd'])*2`", tracks(6),
        price=Price("drop", "tracks/6"), seeds=3, answer=False, style=("#e6550d", "^")),
    Way("all-caat", "drop", "all `caat` (CAAT-Net), p = 0.5", _caat,
        price=Price("partial sync", "partial sync"), seeds=10,
        node=Node("all caat", "drop: half of each sync's channels (CAAT-Net)"), style=("#ad494a", "8")),
    Way("all-caat-p0.25", "drop", "all `caat`, p = 0.25", _caat, {"caat_sync_fraction": 0.25},
        Price("partial sync", "partial sync p=0.25"), seeds=3, answer=False, style=("#843c39", "8")),
    Way("all-caat-p0.75", "drop", "all `caat`, p = 0.75", _caat,
        {"caat_sync_fraction": 0.75}, Price("partial sync", "partial sync p=0.75"), seeds=3, answer=False,
        style=("#d6616b", "8")),
    Way("tp_overlap=2", "hide", "`tp_overlap=2`", _tp, {"tp_overlap": 2},
        Price("overlap", "overlap K={chunks}"),
        node=Node("tp overlap2", "hide: batch in 2 chunks, each sync beside the next chunk"),
        style=("#2ca02c", "D")),
    Way("sequence_parallel", "hide", "sequence parallelism", _tp, {"sequence_parallel": True},
        Price("sequence parallel", "+sp"),
        node=Node("tp +sp", "hide: sequence parallelism (reduce-scatter + all-gather)"),
        style=("#9a9a00", "d")),
    Way("collective_matmul", "hide", "collective matmul (`tp_collective_matmul`)", _tp,
        {"sequence_parallel": True, "tp_collective_matmul": True}, Price("collective matmul", "collective "
                                                                         "matmul"),
        node=Node("tp +sp ring", "hide: collective matmul, SP's collectives as rings beside partial GEMMs"),
        style=("#006d2c", "H")),
    Way("all-ladder-fwd-only", "delay", "all `ladder`, forward only", _ladder, price=Price("delay", "ladder"),
        answer=False, node=Node("all ladder", "delay: each sync one module late")),
    # priced as the repo runs it with tp_async_grad=True (its math is the same without)
    Way("all-ladder", "delay", "all `ladder`", _ladder, price=Price("delay both", "ladder fwd+bwd"), seeds=10,
        node=Node("all ladder async", "delay: forward and backward syncs one module late",
                  {"tp_async_grad": True}),
        style=("#1f77b4", "v")),  # every sync kept, each one module late (Ladder Residual)
    Way("ladder-upper", "delay", "`ladder` in the upper half", lambda n: ["tp"] * (n // 2) + ["ladder"]
        * (n - n // 2),
        seeds=3, style=("#17becf", "<")),  # the paper's conversion of the upper half
    Way("all-tp-bf16", "shrink", "bf16", _tp, {"tp_comm_dtype": "bf16"}, Price("compress", "bf16"), seeds=3,
        node=Node("tp bf16", "shrink: bf16 partial sums, one-shot"), style=("#9467bd", "P")),
    Way("all-tp-bf16-2shot", "shrink", "bf16 two-shot", _tp, {"tp_comm_dtype": "bf16",
                                                              "tp_comm_exchange": "two_shot"},
        Price("compress", "bf16 2shot"), answer=False),
    Way("all-tp-fp8", "shrink", "fp8", _tp, {"tp_comm_dtype": "fp8"}, Price("compress", "fp8"), seeds=3,
        node=Node("tp fp8", "shrink: fp8 block-quantized, one-shot"), style=("#e377c2", "X")),
    Way("all-tp-fp8-2shot", "shrink", "fp8 two-shot", _tp, {"tp_comm_dtype": "fp8",
                                                            "tp_comm_exchange": "two_shot"},
        Price("compress", "fp8 2shot"), answer=False),
    Way("all-tp-int8", "shrink", "int8", _tp, {"tp_comm_dtype": "int8"}, Price("compress", "int8"), seeds=10,
        node=Node("tp int8", "shrink: int8 block-quantized, one-shot"), style=("#7b4173", "p")),
    Way("all-tp-int8-2shot", "shrink", "int8 two-shot", _tp, {"tp_comm_dtype": "int8",
                                                              "tp_comm_exchange": "two_shot"},
        Price("compress", "int8 2shot"), seeds=10, node=Node("tp int8 2shot", "shrink: int8, two-shot "
                                                             "exchange"),
        style=("#c51b8a", "h")),
    Way("all-spd-int8", "drop + shrink", "all `spd` + int8", _spd, {"tp_comm_dtype": "int8"},
        Price("drop", "spd int8"),
        seeds=10, node=Node("spd int8", "drop + shrink: one sync per block, int8"), style=("#7f7f7f", "*")),
)


def way(key):
    """The Way of a key ('all-spd'); KeyError naming the keys when there is none."""
    found = {w.key: w for w in WAYS}
    if key not in found:
        raise KeyError(f"no way {key!r}; the ways are {', '.join(found)}")
    return found[key]


def patterns():
    """{key: block_types of n layers} of the trained ways that only set a block pattern (no sync option): the
    names readings.pattern_name gives result rows, in the table's order."""
    return {w.key: w.blocks for w in WAYS if w.seeds and not w.sync}
