"""A hostile user's pass over every entry point: each input run as a user would, its
outcome classed, and the counts printed for docs/reliability.md. Run: OMP_NUM_THREADS=1 python
tests/support/hostile_pass.py (a few minutes on 2 CPU cores). Outcomes:
  refused   one `error:` line naming the value, exit 2, no traceback, nothing written over the sentinel file
  accepted  exit 0: a legitimate input, which did what it says (each listed with why under ACCEPTED)
  stopped   one `error:` line, exit 1: found only once the run started (each listed with why under STOPPED)
  traceback / other exit / damage   a bug (the pass fails)."""

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: conftest
from conftest import run_script  # noqa: E402

TINY = ["--device=cpu", "--compile=False", "--dtype=float32", "--n_layer=2", "--n_head=4", "--n_embd=32",
        "--block_size=32", "--batch_size=4", "--eval_iters=1", "--max_iters=0",
        "--gradient_accumulation_steps=1", "--dataset=shakespeare_char"]
# inputs that are legitimate: exit 0 is the right outcome, for the reason given
# inputs that can only fail once the run starts: one `error:` line, exit 1 (a RunError), for the reason given
STOPPED = {"train --wandb_log=True": "wandb without an API key fails in wandb.init, after the model is built"}
ACCEPTED = {
    "train --dtype=bfloat16": "bf16 autocast runs on CPU",
    "sample --top_k=None": "top_k=None means all tokens (documented)",
    "train --max_iters=0": "evaluates and stops (nanoGPT's steps 0..N)",
}


def inputs(d):
    """(label, argv) per input; d: a scratch folder holding `file` (a sentinel),
    `ckpt` (a tiny GPT run), `empty`."""
    T = ["train.py", *TINY, f"--out_dir={d}/t"]
    D = [*T, "--model_type=distributed_gpt", "--tp_size=2"]
    B = ["bench.py", "--device=cpu", "--n_layer=2", "--n_head=4", "--n_embd=32", "--block_size=16",
         "--vocab_size=65", "--batch_size=2", "--iters=1", "--warmup=0"]
    BD = [*B, "--model_type=distributed_gpt", "--tp_size=2"]
    S = ["sample.py", "--device=cpu", f"--out_dir={d}/ckpt", "--num_samples=1", "--max_new_tokens=4"]
    E, G, C, TR = ["experiment.py"], ["-m", "tpcomm.gpu.gpu_check"], ["comm_model.py"], ["-m",
                                                                                         "tpcomm.bench.trace"]
    f = f"{d}/file"
    rows = [(f"train {a}", [*T, a]) for a in ("--n_layer=-1", "--n_head=0", "--n_embd=33", "--block_size=0",
                                              "--batch_size=1.5", "--batch_size='4'", "--learning_rate=-1",
                                              "--learning_rate=nan", "--learning_rate=inf",
                                              "--learning_rate=1e309", "--beta2=1.0", "--dropout=-0.1",
                                              "--grad_clip=-1", "--weight_decay=None", "--max_iters=True",
                                              "--eval_interval=0", "--eval_iters=0", "--log_interval=0",
                                              "--warmup_iters=-3", "--gradient_accumulation_steps=0",
                                              "--seed=-1", "--device=cuda", "--device=cuda:7", "--device=xla",
                                              "--dtype=float8", "--dtype=bfloat16", "--model_type=llama",
                                              "--loss_parallel=True", "--init_from=gpt3",
                                              "--init_from=resume", f"--out_dir={f}", "--out_dir=",
                                              "--data_dir=/nonexistent", "--dataset=nonexistent",
                                              "--checkpoint_format=zip", "--pp_size=0", "--pp_size=2",
                                              "--pp_schedule=zigzag", "--data_parallel=zero3",
                                              "--init_device=gpu", "--dp_shard=3", "--unknown_key=1",
                                              "--batch_size", "--gelu_approximate=fast", "--bias=maybe",
                                              "--compile=1", "--max_iters=1e3", "--backend=mpi",
                                              "--tp_overlap=2", "--sequence_parallel=True",
                                              "--tp_comm_dtype=int8", "/nonexistent.py", "--max_iters=0",
                                              f"--trace={f}", "--trace=", "--wandb_log=True")]
    rows += [(f"train D {a}", [*D, a]) for a in ("--tp_size=3", "--tp_size=0", "--tp_size=-2",
                                                 "--block_types=['spd']", "--block_types=foo",
                                                 "--block_types=['spd','bar']", "--block_types=5",
                                                 "--tp_mode=hybrid", "--tp_overlap=0", "--tp_overlap=3",
                                                 "--tp_overlap=True", "--sequence_parallel=1",
                                                 "--tp_comm_dtype=fp4", "--tp_comm_block=0",
                                                 "--tp_comm_exchange=three_shot",
                                                 "--block_types=ladder|--sequence_parallel=True",
                                                 f"--trace={d}/trace.json|--trace_iter=-1",
                                                 f"--trace={d}/trace.json|--trace_iter=99")]
    rows = [(label, [*argv[:-1], *argv[-1].split("|")]) for label, argv in rows]
    rows += [(f"bench {a}", [*B, a]) for a in ("--iters=0", "--warmup=-1", "--patterns=['spd']",
                                               "--mode=decode|--batch_sizes=[0]",
                                               "--mode=decode|--prompt_len=100",
                                               "--mode=decode|--new_tokens=0", "--profile=-1",
                                               "--mode=decode|--profile=2", "--trace_steps=0",
                                               f"--plot={d}/p.png", "--pp_size=2", "--data_parallel=zero",
                                               "--dtype=half", "--compare=maybe", f"--trace={d}",
                                               "--vocab_size=0")]
    rows += [(f"bench D {a}", [*BD, a]) for a in (
        "--patterns=5", "--variants=[]", "--variants=[{'foo': 1}]", "--variants={'tp_overlap': 2}",
        "--variants=[{'tp_comm_dtype': 8}]", "--variants=[{'sequence_parallel': 'yes'}]", "--tp_overlap=3")]
    rows = [(label, [*argv[:-1], *argv[-1].split("|")]) for label, argv in rows]
    rows += [(f"sample {a}", [*S, a]) for a in ("--temperature=0", "--temperature=-1", "--top_k=0",
                                                "--top_k=None", "--max_new_tokens=-1",
                                                "--start=FILE:/nonexistent", "--start=", "--start=\u20ac",
                                                "--init_from=gpt5", "--out_dir=/nonexistent",
                                                f"--out_dir={d}/empty", f"--out_dir={d}/corrupt",
                                                "--tp_mode=real", "--prompt=x|--start=y", "--seed=-1",
                                                "--tp_size=0", "--kv_cache=2", "--dtype=float8")]
    rows = [(label, [*argv[:-1], *argv[-1].split("|")]) for label, argv in rows]
    return rows + tool_inputs(d, E, G, C, TR, f)


def tool_inputs(d, E, G, C, TR, f):
    """inputs() of experiment.py, gpu_check, comm_model and the trace tool."""
    rows = []
    rows += ([(f"experiment {' '.join(a)}", [*E, *a]) for a in (["nosuch"], ["cpu", "--seeds=a"],
                                                                ["cpu", "--seeds=1,1"], ["cpu", "--nproc=0"],
                                                                ["cpu", f"--out={f}"], ["cpu", "--bogus"],
                                                                ["cpu", "gpt2"], ["report", "nosuch"],
                                                                ["report", "--check=maybe"],
                                                                ["report", "--foo"], ["gpu-node",
                                                                                      "--nproc=0"],
                                                                ["gpu-node", "--shapes=huge"],
                                                                ["gpu-node", "--backend=mpi"],
                                                                ["gpu-node", "--backend=nccl",
                                                                 "--device=cpu"], ["gpu-node", "--mfu=2"],
                                                                ["gpu-node", "--mfu=nan"], ["gpu-node",
                                                                                            "--iters=x"],
                                                                ["gpu-node", "--unknown=1"],
                                                                ["cpu", "--dry-run", "--seed=1"],
                                                                ["gpu-node", "--dry-run=2"],
                                                                ["cpu", "--counts=yes"], ["gpu-node",
                                                                                          "--shapes="],
                                                                ["gpu-node", "--rehearsal", "--report-only",
                                                                 f"--out={d}/empty"])])
    rows += [(f"gpu_check {a}", [*G, a]) for a in ("--sizes=huge", "--device=tpu", "--sections=foo",
                                                   "--sections=,", f"--out_dir={f}", "--out_dir=/nonexistent",
                                                   "--worker=foo", "--sizes=full")]
    rows += [(f"comm_model {' '.join(a)}", [*C, *a]) for a in (
        ["nosuch"], ["--mfu=0"], ["--mfu=2"], ["--tp_overlap=0"], ["--efficiency=2"], ["--baseline=foo"],
        ["measure"], ["measure", "--out=/nonexistent/x.json"], ["measure", f"--out={f}"],
        ["measure", f"--out={d}/c.json", "--procs=1"], ["validate", "--calibration=/nonexistent"],
        ["validate", f"--calibration={f}"])]
    rows += [(f"trace {' '.join(a)}", [*TR, *a]) for a in ([], ["summary", "/nonexistent"], ["summary", f],
                                                           ["plot", f"{d}/o.png", "/nonexistent"],
                                                           ["plot", f"{d}/o.png", f], ["plot", f"{d}/o.png",
                                                                                       f, "--step=x"],
                                                           ["plot", f"{d}/o.png", f, "--labels=[1]"],
                                                           ["bogus"], ["plot", f"{d}/o.svg", f],
                                                           ["plot", "/nonexistent/o.png", f])]
    return rows


def prepare(d):
    with open(f"{d}/file", "wb") as fh:
        fh.write(b"SENTINEL: another run's file")
    os.makedirs(f"{d}/empty")
    os.makedirs(f"{d}/corrupt")
    with open(f"{d}/corrupt/ckpt.pt", "wb") as fh:
        fh.write(b"\x00garbage")
    r = run_script("train.py", *TINY, f"--out_dir={d}/ckpt", "--max_iters=1", "--eval_interval=1")
    assert r.returncode == 0, r.stderr


def outcome(r, d):
    with open(f"{d}/file", "rb") as fh:
        if fh.read() != b"SENTINEL: another run's file":
            return "damage"
    if "Traceback" in r.stderr:
        return "traceback"
    lines = r.stderr.strip().splitlines()
    if r.returncode in (1, 2) and len(lines) == 1 and lines[0].startswith("error: "):
        return "refused" if r.returncode == 2 else "stopped"
    return "accepted" if r.returncode == 0 else f"exit {r.returncode}"


def main():
    counts, bad = {}, []
    with tempfile.TemporaryDirectory() as d:
        prepare(d)
        for label, argv in inputs(d):
            r = run_script(*argv, timeout=300)
            kind = outcome(r, d)
            entry = label.split(" ")[0]
            counts.setdefault(entry, {}).setdefault(kind, 0)
            counts[entry][kind] += 1
            line = (r.stderr.strip().splitlines() or [""])[-1][:150]
            print(f"{kind:9} {label}: {line if kind != 'accepted' else ACCEPTED.get(label, 'NOT EXPLAINED')}")
            if kind not in ("refused", "accepted", "stopped") or (kind == "accepted"
                                                                  and label not in ACCEPTED) or \
                    (kind == "stopped" and label not in STOPPED):
                bad.append(label)
    total = sum(sum(c.values()) for c in counts.values())
    print(f"\n{total} inputs")
    for entry, c in counts.items():
        print(f"| {entry} | {sum(c.values())} | " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())) + " "
              "|")
    print("not as promised: " + (", ".join(bad) or "none"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
