"""The fourth and fifth hostile passes (docs/reliability.md): 147 inputs on the newest surface (the published
caat's options, resume and sample of caat checkpoints, --jobs, JSON config files, prepare --source,
gpu-scale's options, the report's readers of result files; then, named 'registry: ...', the block types'
options as config keys and as a checkpoint holds them), each printed with its exit status and last stderr
line. The report cases plant changed result files in a clone, never in the checkout.

    OMP_NUM_THREADS=1 python tests/support/hostile_pass_new_surface.py . [CASE-SUBSTRING ...]   # ~5 min

argv[1]: the repository (its data/shakespeare_char prepared); writes results.json
in a fresh temporary folder."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(sys.argv[1])
W = tempfile.mkdtemp(prefix="hostile-")  # its own scratch folder: two passes at once do not collide
PY = sys.executable
DATA = os.path.join(REPO, "data", "shakespeare_char")
TINY = ["--device=cpu", "--compile=False", "--n_layer=2", "--n_head=4", "--n_embd=32", "--block_size=32",
        "--batch_size=4", "--eval_iters=2", "--log_interval=1", "--warmup_iters=2", "--dropout=0.0",
        "--gradient_accumulation_steps=1", "--max_iters=2", "--eval_interval=2", f"--data_dir={DATA}"]
D2 = ["--model_type=distributed_gpt", "--tp_size=2"]


def run(argv, timeout=180, env=None):
    t0 = time.time()
    try:
        r = subprocess.run([PY, *argv], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))
    except subprocess.TimeoutExpired:
        return dict(rc="timeout", err="", out="", s=timeout)
    return dict(rc=r.returncode, err=r.stderr, out=r.stdout, s=round(time.time() - t0, 1))


COUNT = [0]


def train(out, *extra):
    if out == "o":  # a fresh folder per case, so no case reads another's files
        COUNT[0] += 1
        out = f"o{COUNT[0]}"
    return ["train.py", *TINY, f"--out_dir={W}/{out}", *extra]


# checkpoints the cases read
for name, extra in (("gpt", []), ("caat", [*D2, "--block_types=caat"]),
                    ("caat25", [*D2, "--block_types=caat", "--caat_sync_fraction=0.25"])):
    r = run(train(name, *extra))
    assert r["rc"] == 0, r["err"]

# caat checkpoints whose caat_sync_fraction a hand changed (a block type's option as a checkpoint holds it)
import torch  # noqa: E402
TAMPERED = {"half": "half", "zero": 0.0, "tiny": 1e-300, "list": [0.5], "unknown key": None}
for name, value in TAMPERED.items():
    shutil.copytree(f"{W}/caat", f"{W}/caat-{name}")
    ck = torch.load(f"{W}/caat-{name}/ckpt.pt", weights_only=True)
    ck["model_options"].update({"toy_gain": 2.0} if value is None else {"caat_sync_fraction": value})
    torch.save(ck, f"{W}/caat-{name}/ckpt.pt")
BENCH = ["bench.py", "--device=cpu", *D2, "--n_layer=2", "--n_head=4", "--n_embd=32", "--block_size=16",
         "--iters=1"]

# a result-file clone for the report's readers
CLONE = f"{W}/clone"
subprocess.run(["git", "clone", "-q", REPO, CLONE], check=True)
RUNS = f"{CLONE}/experiments/cpu-long/runs"
BASE = json.load(open(f"{RUNS}/all-caat-seed1337.json"))

with open(f"{W}/bad.json", "w") as f:
    f.write('{"max_iters": 3, "no_such_key": 1}')
with open(f"{W}/trunc.json", "w") as f:
    f.write('{"max_iters": 3')
with open(f"{W}/syntax.py", "w") as f:
    f.write("max_iters = = 3\n")
with open(f"{W}/ok.json", "w") as f:
    f.write('{"max_iters": 1, "eval_interval": 1}')
with open(f"{W}/binary.bin", "wb") as f:
    f.write(bytes(range(256)) * 4)
open(f"{W}/afile", "w").write("x")

CASES = [
    # train.py: the published caat's options
    ("train caat p=0", train("o", *D2, "--block_types=caat", "--caat_sync_fraction=0")),
    ("train caat p=1.5", train("o", *D2, "--block_types=caat", "--caat_sync_fraction=1.5")),
    ("train caat p='half'", train("o", *D2, "--block_types=caat", "--caat_sync_fraction=half")),
    ("train caat p=True", train("o", *D2, "--block_types=caat", "--caat_sync_fraction=True")),
    ("train caat p=0.3 (not whole channels)", train("o", *D2, "--block_types=caat",
                                                    "--caat_sync_fraction=0.3")),
    ("train caat p=None", train("o", *D2, "--block_types=caat", "--caat_sync_fraction=None")),
    ("train caat int8", train("o", *D2, "--block_types=caat", "--tp_comm_dtype=int8")),
    ("train caat sequence_parallel", train("o", *D2, "--block_types=caat", "--sequence_parallel=True")),
    ("train caat tp_overlap=2", train("o", *D2, "--block_types=caat", "--tp_overlap=2")),
    ("train caat tp_size=3", train("o", "--model_type=distributed_gpt", "--tp_size=3", "--block_types=caat")),
    ("train caat pattern too long", train("o", *D2, "--block_types=['caat']*3")),
    ("train block_types 'CAAT'", train("o", *D2, "--block_types=CAAT")),
    ("train block_types []", train("o", *D2, "--block_types=[]")),
    ("train block_types 'caat,tp'", train("o", *D2, "--block_types=caat,tp")),
    ("train p=0.25 without caat", train("o", *D2, "--caat_sync_fraction=0.25")),
    ("train caat on gpt", train("o", "--block_types=caat")),
    ("train caat tp 1 p=0.25", train("o", "--model_type=distributed_gpt", "--block_types=caat",
                                     "--caat_sync_fraction=0.25")),
    ("train caat pp_size=2 alone", train("o", *D2, "--block_types=caat", "--pp_size=2")),
    # train.py: plain keys
    ("train tp_size=0", train("o", "--model_type=distributed_gpt", "--tp_size=0")),
    ("train tp_size=2.0", train("o", "--model_type=distributed_gpt", "--tp_size=2.0")),
    ("train max_iters=-1", train("o", "--max_iters=-1")),
    ("train eval_interval=0", train("o", "--eval_interval=0")),
    ("train log_interval=0", train("o", "--log_interval=0")),
    ("train batch_size=0", train("o", "--batch_size=0")),
    ("train learning_rate=nan", train("o", "--learning_rate=nan")),
    ("train learning_rate=-1", train("o", "--learning_rate=-1")),
    ("train dropout=1.5", train("o", "--dropout=1.5")),
    ("train dropout=-0.1", train("o", "--dropout=-0.1")),
    ("train block_size=100000", train("o", "--block_size=100000")),
    ("train out_dir /proc", ["train.py", *TINY, "--out_dir=/proc/x"]),
    ("train out_dir ''", ["train.py", *TINY, "--out_dir="]),
    ("train out_dir a file", ["train.py", *TINY, f"--out_dir={W}/afile"]),
    ("train data_dir missing", ["train.py", *TINY[:-1], "--data_dir=/nonexistent", f"--out_dir={W}/o"]),
    ("train resume from nothing", train("empty", "--init_from=resume")),
    ("train init_from gpt3", train("o", "--init_from=gpt3")),
    ("train device cuda", train("o", "--device=cuda")),
    ("train device tpu", train("o", "--device=tpu")),
    ("train dtype int8", train("o", "--dtype=int8")),
    ("train grad_clip -1", train("o", "--grad_clip=-1")),
    ("train beta1 2", train("o", "--beta1=2")),
    ("train grad accum 0", train("o", "--gradient_accumulation_steps=0")),
    ("train seed -1", train("o", "--seed=-1")),
    ("train seed 1.5", train("o", "--seed=1.5")),
    ("train compile yes", train("o", "--compile=yes")),
    ("train overwrite 1", train("o", "--overwrite=1")),
    ("train json config unknown key", ["train.py", f"{W}/bad.json", *TINY, f"--out_dir={W}/o"]),
    ("train json config truncated", ["train.py", f"{W}/trunc.json", *TINY, f"--out_dir={W}/o"]),
    ("train py config syntax error", ["train.py", f"{W}/syntax.py", *TINY, f"--out_dir={W}/o"]),
    ("train config missing", ["train.py", f"{W}/nope.py", *TINY, f"--out_dir={W}/o"]),
    ("train json config legit", ["train.py", f"{W}/ok.json", *TINY, f"--out_dir={W}/json-ok"]),
    ("train trace a folder", train("o", f"--trace={W}")),
    ("train trace_iter -1", train("o", "--trace_iter=-1")),
    ("train checkpoint_format zip", train("o", "--checkpoint_format=zip")),
    ("train data_parallel zero3", train("o", "--data_parallel=zero3")),
    ("train tp_mode fake", train("o", *D2, "--tp_mode=fake")),
    ("train tp_mode real alone", train("o", *D2, "--tp_mode=real")),
    ("train max_iter (typo)", train("o", "--max_iter=3")),
    ("train resume caat with p=0.75", train("caat", "--init_from=resume", "--max_iters=4",
                                             "--caat_sync_fraction=0.75")),
    ("train resume caat tp_size=1", train("caat", "--init_from=resume", "--max_iters=4", "--tp_size=1")),
    ("train resume caat25 tp_size=1", train("caat25", "--init_from=resume", "--max_iters=4", "--tp_size=1")),
    ("train resume block_size 16", train("gpt", "--init_from=resume", "--max_iters=4", "--block_size=16")),
    ("train fresh over a checkpoint", train("gpt")),
    # the block types' options (the registry, tpcomm/model/block_types/): as config keys and in checkpoints
    ("registry: train caat p=1e-300 (0 channels)", train("o", *D2, "--block_types=caat",
                                                         "--caat_sync_fraction=1e-300")),
    ("registry: train caat p=1 (legit: every channel)", train("o", *D2, "--block_types=caat",
                                                              "--caat_sync_fraction=1")),
    ("registry: train caat p=nan", train("o", *D2, "--block_types=caat", "--caat_sync_fraction=nan")),
    ("registry: train caat p=inf", train("o", *D2, "--block_types=caat", "--caat_sync_fraction=inf")),
    ("registry: train caat p=[0.5]", train("o", *D2, "--block_types=caat", "--caat_sync_fraction=[0.5]")),
    ("registry: train key typo caat_sync_frac", train("o", *D2, "--block_types=caat",
                                                      "--caat_sync_frac=0.25")),
    ("registry: train another type's prefix", train("o", *D2, "--tp_sync_fraction=0.25")),
    ("registry: bench caat p=0.3", [*BENCH, "--block_types=caat", "--caat_sync_fraction=0.3"]),
    ("registry: bench p=0.25 without caat", [*BENCH, "--caat_sync_fraction=0.25"]),
    ("registry: bench patterns caat,tp p=0.25 (legit: skips tp)", [*BENCH, "--patterns=['caat','tp']",
                                                                  "--caat_sync_fraction=0.25"]),
    ("registry: sample --caat_sync_fraction", ["sample.py", f"--out_dir={W}/caat",
                                               "--caat_sync_fraction=0.25"]),
    *((f"registry: {script} checkpoint p={name}", train(f"caat-{name}", "--init_from=resume", "--max_iters=4")
       if script == "resume" else ["sample.py", f"--out_dir={W}/caat-{name}", "--num_samples=1",
                                   "--max_new_tokens=5", "--device=cpu"])
      for name in TAMPERED for script in ("resume", "sample")),
    # experiment.py: the runner's new and old options
    ("sweep --jobs=0", ["experiment.py", "cpu", "--jobs=0", "--dry-run"]),
    ("sweep --jobs=abc", ["experiment.py", "cpu", "--jobs=abc", "--dry-run"]),
    ("sweep --jobs (no value)", ["experiment.py", "cpu", "--jobs", "--dry-run"]),
    ("sweep --jobs=-2", ["experiment.py", "cpu", "--jobs=-2", "--dry-run"]),
    ("sweep --jobs=2.5", ["experiment.py", "cpu", "--jobs=2.5", "--dry-run"]),
    ("sweep --runs=nonexistent", ["experiment.py", "cpu", "--runs=nonexistent", "--dry-run"]),
    ("sweep cpu-long --runs=all-caat-p0.5", ["experiment.py", "cpu-long", "--runs=all-caat-p0.5",
                                             "--dry-run"]),
    ("sweep --seeds=", ["experiment.py", "cpu", "--seeds=", "--dry-run"]),
    ("sweep --seeds=1337,,1338", ["experiment.py", "cpu", "--seeds=1337,,1338", "--dry-run"]),
    ("sweep --nproc=0", ["experiment.py", "cpu", "--nproc=0", "--dry-run"]),
    ("sweep --out=", ["experiment.py", "cpu", "--out=", "--dry-run"]),
    ("sweep --out=/proc/x", ["experiment.py", "cpu", "--out=/proc/x", "--dry-run"]),
    ("sweep unknown override", ["experiment.py", "cpu", "--bogus_key=1", "--dry-run"]),
    ("sweep two sweeps", ["experiment.py", "cpu", "cpu-long", "--dry-run"]),
    ("sweep gpu-node listed", ["experiment.py", "gpu-node", "--dry-run", "--shapes=huge"]),
    ("report bogus sweep", ["experiment.py", "report", "bogus"]),
    ("report --check=maybe", ["experiment.py", "report", "--check=maybe"]),
    ("report --bogus", ["experiment.py", "report", "--bogus"]),
    ("gpu-scale budget 0", ["experiment.py", "gpu-scale", "--budget-minutes=0"]),
    ("gpu-scale budget abc", ["experiment.py", "gpu-scale", "--budget-minutes=abc"]),
    ("gpu-scale dry-run out a file", ["experiment.py", "gpu-scale", "--dry-run", f"--out={W}/afile"]),
    ("gpu-scale concurrent 0", ["experiment.py", "gpu-scale", "--dry-run", "--concurrent=0"]),
    ("gpu-scale no budget", ["experiment.py", "gpu-scale"]),
    # sample.py
    ("sample num_samples 0", ["sample.py", f"--out_dir={W}/gpt", "--num_samples=0"]),
    ("sample max_new_tokens -1", ["sample.py", f"--out_dir={W}/gpt", "--max_new_tokens=-1"]),
    ("sample temperature 0", ["sample.py", f"--out_dir={W}/gpt", "--temperature=0", "--max_new_tokens=4"]),
    ("sample temperature -1", ["sample.py", f"--out_dir={W}/gpt", "--temperature=-1"]),
    ("sample top_k 0", ["sample.py", f"--out_dir={W}/gpt", "--top_k=0"]),
    ("sample start FILE missing", ["sample.py", f"--out_dir={W}/gpt", "--start=FILE:/nonexistent"]),
    ("sample start empty", ["sample.py", f"--out_dir={W}/gpt", "--start=", "--max_new_tokens=4"]),
    ("sample start unknown chars", ["sample.py", f"--out_dir={W}/gpt", "--start=\u00e9\u00e9"]),
    ("sample caat tp_size=3", ["sample.py", f"--out_dir={W}/caat", "--tp_size=3"]),
    ("sample caat tp_size=1", ["sample.py", f"--out_dir={W}/caat", "--tp_size=1", "--max_new_tokens=4"]),
    ("sample caat25 tp_size=1", ["sample.py", f"--out_dir={W}/caat25", "--tp_size=1", "--max_new_tokens=4"]),
    ("sample caat legit", ["sample.py", f"--out_dir={W}/caat", "--max_new_tokens=4"]),
    # bench.py
    ("bench caat p=0.75", ["bench.py", "--device=cpu", "--n_layer=2", "--n_head=4", "--n_embd=32",
                           "--block_size=16",
                           "--vocab_size=65", "--batch_size=2", "--iters=1", "--warmup=0", *D2,
                           "--block_types=caat",
                           "--caat_sync_fraction=0.75"]),
    ("bench iters 0", ["bench.py", "--device=cpu", "--iters=0"]),
    ("bench warmup -1", ["bench.py", "--device=cpu", "--warmup=-1"]),
    ("bench mode bogus", ["bench.py", "--device=cpu", "--mode=bogus"]),
    ("bench caat at tp 1", ["bench.py", "--device=cpu", "--n_layer=2", "--n_head=4", "--n_embd=32",
                            "--block_size=16", "--vocab_size=65", "--batch_size=2", "--iters=1", "--warmup=0",
                            "--model_type=distributed_gpt", "--block_types=caat",
                            "--caat_sync_fraction=0.25"]),
    # prepare.py
    ("prepare source bogus", ["data/shakespeare_char/prepare.py", "--source=bogus", f"--out_dir={W}/p"]),
    ("prepare input /dev/null", ["data/shakespeare_char/prepare.py", "--input=/dev/null",
                                 f"--out_dir={W}/p"]),
    ("prepare input binary", ["data/shakespeare_char/prepare.py", f"--input={W}/binary.bin",
                              f"--out_dir={W}/p"]),
    ("prepare out_dir /proc", ["data/shakespeare_char/prepare.py", "--out_dir=/proc/x"]),
    ("prepare input and source tiny", ["data/shakespeare_char/prepare.py", f"--input={REPO}/README.md",
                                       "--source=tiny", f"--out_dir={W}/p2"]),
    # export_hf.py
    ("export caat checkpoint", ["export_hf.py", f"--out_dir={W}/caat", f"--hf_dir={W}/hf-caat"]),
    ("export hf_dir a file", ["export_hf.py", f"--out_dir={W}/gpt", f"--hf_dir={W}/afile"]),
    ("export hf_dir /proc", ["export_hf.py", f"--out_dir={W}/gpt", "--hf_dir=/proc/x"]),
    # comm_model.py, spd.py
    ("comm_model mfu 0", ["comm_model.py", "--mfu=0"]),
    ("comm_model efficiency 2", ["comm_model.py", "--efficiency=2"]),
    ("comm_model tp_overlap 0", ["comm_model.py", "--tp_overlap=0"]),
    ("comm_model seq_len -1", ["comm_model.py", "--seq_len=-1"]),
    ("spd tp_size 3", ["spd.py", f"--out_dir={W}/gpt", "--tp_size=3"]),
    ("spd on a caat checkpoint", ["spd.py", f"--out_dir={W}/caat", "--tp_size=2"]),
]


def plant(name, change):
    """A result file of the clone's cpu-long, changed; the report --check's reading of it."""
    rec = json.loads(json.dumps(BASE))
    change(rec)
    with open(f"{RUNS}/{name}", "w") as f:
        f.write(json.dumps(rec) if not isinstance(rec, str) else rec)


REPORT_CASES = [
    ("report: cpu_capability a number", lambda r: r["machine"].update(cpu_capability=5)),
    ("report: machine a list", lambda r: r.update(machine=[1])),
    ("report: caat_sync_fraction a string", lambda r: r["config"].update(caat_sync_fraction="half")),
    ("report: val_curve a dict", lambda r: r.update(val_curve={"a": 1})),
    ("report: val_curve with NaN", lambda r: r["val_curve"][3].__setitem__(2, float("nan"))),
    ("report: val_curve iters unsorted", lambda r: r.update(val_curve=r["val_curve"][::-1])),
    ("report: tokens_per_iter 0", lambda r: r.update(tokens_per_iter=0)),
    ("report: seed disagrees with name", lambda r: r.update(seed=1)),
    ("report: val_loss a string", lambda r: r.update(val_loss="low")),
    ("report: data sha256 a number", lambda r: r["data"].update(sha256=5)),
]


ONLY = sys.argv[2:]  # case names (substrings) to run, else all
results = []
for name, argv in CASES:
    if ONLY and not any(o in name for o in ONLY):
        continue
    r = run(argv)
    results.append(dict(name=name, argv=argv, **r))
    print(f"{name}: rc={r['rc']} {r['s']}s "
          f"{r['err'].strip().splitlines()[-1][:160] if r['err'].strip() else ''}", flush=True)
for name, change in REPORT_CASES:
    if ONLY and not any(o in name for o in ONLY):
        continue
    shutil.copy(f"{RUNS}/all-caat-seed1337.json", f"{W}/keep.json")
    plant("all-caat-seed1337.json", change)
    r2 = subprocess.run([PY, "experiment.py", "report", "--check"], cwd=CLONE, capture_output=True, text=True,
                        timeout=300)
    shutil.copy(f"{W}/keep.json", f"{RUNS}/all-caat-seed1337.json")
    out = dict(rc=r2.returncode, err=r2.stderr, out=r2.stdout, s=0)
    results.append(dict(name=name, argv=["report --check (clone)"], **out))
    last = (r2.stderr.strip() or r2.stdout.strip()).splitlines()
    print(f"{name}: rc={r2.returncode} {last[-1][:200] if last else ''}", flush=True)

json.dump(results, open(os.path.join(W, "results.json"), "w"), indent=1)
print(f"results: {W}/results.json")
