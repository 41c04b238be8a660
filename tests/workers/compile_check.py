"""Shared by tests/model/test_compile.py and tests/workers/compile_worker.py: train a tiny model compiled
and eagerly with the same dropout keys, counting recompiles after warm-up (torch._dynamo turns a
recompile into an error there)."""

import torch
import torch._dynamo

from tpcomm.train.build import build_model

SIZES = dict(block_size=16, vocab_size=48, n_layer=2, n_head=4, n_embd=32, bias=True)
WARMUP, STEPS = 2, 4


def make(model_type, dropout, pd=None, extra=None):
    torch.manual_seed(0)
    config = dict(SIZES, dropout=dropout, tp_size=2, block_types=["tp", "spd"])
    return build_model(model_type, dict(config, **(extra or {})), pd=pd)


def run_steps(model_type, dropout, *, pd=None, backend="aot_eager", extra=None):
    """Losses and collective counts of WARMUP + STEPS training steps (each with its own dropout key, each
    followed by an eval forward), compiled and eager from the same weights; 'recompiled' is True if dynamo had
    to trace again after the warm-up."""
    g = torch.Generator().manual_seed(1)
    data = [(torch.randint(48, (4, 16), generator=g), torch.randint(48, (4, 16), generator=g))
            for _ in range(WARMUP + STEPS)]
    from torch._dynamo.utils import counters

    counters.clear()
    out = {}
    for mode in ("eager", "compiled"):
        model = make(model_type, dropout, pd, extra)
        run = torch.compile(model, backend=backend) if mode == "compiled" else model
        torch._dynamo.reset()
        losses, counts, recompiled = [], [], False
        for it, (x, y) in enumerate(data):
            if it == WARMUP and mode == "compiled":
                torch._dynamo.config.error_on_recompile = True
            model.train()
            model.seed_dropout(1337, it, 0)
            model.reset_comm_counts()
            try:
                _, loss = run(x, y)
                loss.backward()
                report = model.comm_report(micro_steps=1, tokens=x.numel())
                counts.append([report.get(k) for k in ("fwd_allreduces", "bwd_allreduces",
                                                       "comm_bytes_per_token", "fwd_reduce_scatters",
                                                       "vocab_allreduces")])
                model.eval()
                with torch.no_grad():
                    run(x, y)
            except torch._dynamo.exc.RecompileError:
                recompiled = True
                break
            finally:
                torch._dynamo.config.error_on_recompile = False
                model.zero_grad(set_to_none=True)
            losses.append(loss.item())
        out[mode], out[f"{mode}_counts"] = losses, counts
        out["recompiled"] = out.get("recompiled", False) or recompiled
    out["graph_breaks"] = sum(counters["graph_break"].values())
    out["unique_graphs"] = counters["stats"]["unique_graphs"]  # traced in the compiled pass only
    return out
