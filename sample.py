"""
Sample from a trained model: a checkpoint in out_dir (GPT or DistributedGPT, rebuilt with the
checkpoint's own tp_size and block_types; nanoGPT's checkpoints too) or a pretrained GPT-2. Generation
uses a KV cache (kv_cache=True).
$ python sample.py --out_dir=out-shakespeare-char
$ python sample.py --init_from=gpt2-xl --start="What is the answer to life?" --num_samples=3
$ python sample.py --out_dir=out-gpt2 --start=FILE:prompt.txt
Real tensor parallelism, one shard per process (torchrun takes --start for its own
--start-method: use --prompt):
$ torchrun --standalone --nproc_per_node=2 \
      sample.py --out_dir=out-shakespeare-char-spd --tp_mode=real --prompt="ROMEO:"
"""

import os
import sys

import torch

from tpcomm.train.runtime import autocast_context, pick_device_and_dtype, setup_runtime
from tpcomm.train.checkpoint import build_model_from_checkpoint, load_checkpoint
from tpcomm.errors import ConfigError
from tpcomm.configuration import configure, exit_on_config_error
from data.vocab import load_vocab
from model import PRETRAINED_SIZES
from tpcomm.model.interface import PlainGPT
from tpcomm.parallel.parallel_dims import check_layout, init_parallel, shutdown

DEFAULTS = dict(
    # 'resume' (from out_dir) or a GPT-2 variant: 'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl'
    init_from="resume",
    out_dir="out",
    start="\n",  # the prompt, or "FILE:path.txt" (UTF-8)
    prompt=None,  # the same as start, under a name torchrun does not take for one of its own options
    num_samples=10,
    max_new_tokens=500,
    temperature=0.8,  # 1.0 = no change, < 1.0 = less random
    top_k=200,  # keep only the top_k most likely tokens (None: all)
    seed=1337,
    # feed only each new token, keys and values of the earlier ones cached (same tokens either way)
    kv_cache=True,
    tp_size=None,  # distributed_gpt: shards per layer (None: the checkpoint's); checkpoints are GPT-layout
    # 'simulated' (one process) | 'real' (torchrun, one shard per process, world = tp_size)
    tp_mode="simulated",
    backend=None,  # real mode: None picks 'nccl' on CUDA, 'gloo' on CPU
    device="auto",
    dtype="auto",
    compile=False,
)


def check_sample_settings(cfg):
    """Every check of the sampling settings, before anything is loaded."""
    if cfg["init_from"] != "resume" and cfg["init_from"] not in PRETRAINED_SIZES:
        raise ConfigError(f"init_from must be 'resume' or one of {list(PRETRAINED_SIZES)}, got "
                          f"{cfg['init_from']!r}")
    if not cfg["temperature"] > 0:
        raise ConfigError(f"temperature must be > 0, got {cfg['temperature']}")
    if cfg["top_k"] is not None and (not isinstance(cfg["top_k"], int) or cfg["top_k"] < 1):
        raise ConfigError(f"top_k must be an int >= 1 or None, got {cfg['top_k']!r}")
    if cfg["num_samples"] < 1:
        raise ConfigError(f"num_samples must be >= 1, got {cfg['num_samples']}")
    if cfg["max_new_tokens"] < 0:
        raise ConfigError(f"max_new_tokens must be >= 0, got {cfg['max_new_tokens']}")
    if cfg["seed"] < 0:
        raise ConfigError(f"seed must be >= 0, got {cfg['seed']}")
    if cfg["prompt"] is not None:
        if cfg["start"] != DEFAULTS["start"]:
            raise ConfigError(f"give the prompt once: start={cfg['start']!r} and prompt={cfg['prompt']!r}")
        cfg["start"] = cfg["prompt"]
    if cfg["tp_size"] is not None and (type(cfg["tp_size"]) is not int or cfg["tp_size"] < 1):
        raise ConfigError(f"tp_size must be an int >= 1 or None, got {cfg['tp_size']!r}")


def read_prompt(start):
    """The prompt text: `start` itself, or the UTF-8 contents of FILE:path."""
    if start.startswith("FILE:"):
        path = start[5:]
        if not os.path.isfile(path):
            raise ConfigError(f"start: no such file {path!r}")
        try:
            with open(path, encoding="utf-8") as f:
                start = f.read()
        except UnicodeDecodeError as e:
            raise ConfigError(f"start: {path!r} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not start:
        raise ConfigError("start: the prompt is empty; give at least one token (the default is a newline)")
    return start


def load_model(cfg, pd=None):
    """(model, encode, decode) for the run in cfg; pd: the process grid (real tensor parallelism)."""
    if cfg["init_from"] in PRETRAINED_SIZES:
        try:
            model = PlainGPT.from_pretrained(cfg["init_from"], dict(dropout=0.0))
        except OSError as e:  # no network and no Hugging Face cache
            raise ConfigError(f"init_from={cfg['init_from']!r}: cannot load the pretrained weights "
                              f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
        return (model, *gpt2_codec())
    checkpoint = load_checkpoint(cfg["out_dir"])
    model = build_model_from_checkpoint(checkpoint, pd=pd, dropout=0.0, tp_size=cfg["tp_size"])
    # the dataset's vocabulary, as nanoGPT finds it: data/<dataset>/ (this repo's runs may name a data_dir)
    trained = checkpoint.get("config") or {}  # the training run's config
    data_dir = trained.get("data_dir") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                                                        str(trained.get("dataset", "")))
    chars = checkpoint.get("vocab_chars")  # the vocabulary it trained on, saved with it since it records one
    vocab = (dict(stoi={c: i for i, c in enumerate(chars)}, itos=dict(enumerate(chars))) if chars is not None
             else load_vocab(data_dir) if trained.get("dataset") and os.path.isdir(data_dir) else None)
    if vocab is not None:
        if pd is None or pd.is_master:
            print(f"loading {data_dir}'s vocabulary" if chars is None else
                  f"loading the checkpoint's vocabulary ({len(chars)} characters)")
        stoi, itos = vocab["stoi"], vocab["itos"]
        unknown = "".join(sorted({c for c in cfg["start"] if c not in stoi}))
        if unknown:
            raise ConfigError(f"start has characters not in the dataset's vocabulary: {unknown!r}")
        return model, (lambda s: [stoi[c] for c in s]), (lambda ids: "".join(itos[i] for i in ids))
    if model.config.vocab_size < 50257:
        raise ConfigError(f"the checkpoint's vocab_size is {model.config.vocab_size}, smaller than GPT-2's, "
                          "and its " f"dataset's vocabulary (meta.json or meta.pkl in {data_dir}) is not "
                          "there")
    return (model, *gpt2_codec())


def gpt2_codec():
    from data.tokenizer import gpt2_encoding

    enc = gpt2_encoding()
    return (lambda s: enc.encode(s, allowed_special={"<|endoftext|>"})), enc.decode


@exit_on_config_error
def main(argv):
    cfg = configure(DEFAULTS, argv, nullable=("top_k",))
    check_sample_settings(cfg)
    cfg["start"] = read_prompt(cfg["start"])
    device, device_type, dtype = pick_device_and_dtype(cfg["device"], cfg["dtype"])
    if cfg["tp_mode"] == "real":  # the layout check needs tp_size before any process group starts
        from_checkpoint = checkpoint_tp_size(cfg)
        cfg["tp_size"] = cfg["tp_size"] or from_checkpoint
    dp, tp = check_layout(tp_size=cfg["tp_size"] or 1, tp_mode=cfg["tp_mode"])
    if dp != 1:
        raise ConfigError(f"sample.py runs one model replica: launch tp_size ({cfg['tp_size']}) processes, "
                          f"not {dp * tp}")
    pd = init_parallel(dp=dp, tp=tp, device_type=device_type, backend=cfg["backend"])
    try:
        if pd.distributed and device_type == "cuda":
            device = f"cuda:{pd.local_rank}"
        sample(cfg, pd, device, device_type, dtype)
    finally:
        shutdown(pd)


def checkpoint_tp_size(cfg):
    """The tp_size of the distributed_gpt checkpoint that real tensor parallelism samples."""
    from tpcomm.train.checkpoint import checkpoint_model

    if cfg["init_from"] != "resume":
        raise ConfigError(f"tp_mode='real' samples a distributed_gpt checkpoint (init_from='resume'), "
                          f"got init_from={cfg['init_from']!r}")
    model_type, spec = checkpoint_model(load_checkpoint(cfg["out_dir"]))
    if model_type != "distributed_gpt":
        raise ConfigError(f"tp_mode='real' needs a distributed_gpt checkpoint, {cfg['out_dir']!r} holds "
                          f"{model_type!r}")
    return spec["tp_size"]


def sample(cfg, pd, device, device_type, dtype):
    """num_samples samples; every tp rank generates the same tokens (same seed,
    identical logits), rank 0 prints."""
    model, encode, decode = load_model(cfg, pd)
    setup_runtime(device_type, cfg["seed"])
    model.eval().to(device)
    if cfg["compile"]:
        model = torch.compile(model)
    x = torch.tensor(encode(cfg["start"]), dtype=torch.long, device=device)[None, ...]
    with torch.no_grad(), autocast_context(device_type, dtype):
        for _ in range(cfg["num_samples"]):
            y = model.generate(x, cfg["max_new_tokens"], temperature=cfg["temperature"], top_k=cfg["top_k"],
                               use_cache=cfg["kv_cache"])
            if pd.is_master:
                print(decode(y[0].tolist()))
                print("---------------")


if __name__ == "__main__":
    main(sys.argv[1:])
