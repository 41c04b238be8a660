"""
Sample from a trained model: a checkpoint in out_dir (GPT or DistributedGPT, rebuilt with the checkpoint's own
tp_size and block_types, simulated on one device; nanoGPT's checkpoints too) or a pretrained GPT-2.
$ python sample.py --out_dir=out-shakespeare-char
$ python sample.py --init_from=gpt2-xl --start="What is the answer to life?" --num_samples=3
$ python sample.py --out_dir=out-gpt2 --start=FILE:prompt.txt
"""

import os
import sys

import torch

from common import (autocast_context, build_model_from_checkpoint, load_checkpoint, pick_device, pick_dtype,
                    setup_runtime)
from configurator import ConfigError, configure, exit_on_config_error
from data.vocab import load_vocab
from model import GPT, PRETRAINED_SIZES

DEFAULTS = dict(
    init_from="resume",  # 'resume' (from out_dir) or a GPT-2 variant: 'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl'
    out_dir="out",
    start="\n",  # the prompt, or "FILE:path.txt" (UTF-8)
    num_samples=10,
    max_new_tokens=500,
    temperature=0.8,  # 1.0 = no change, < 1.0 = less random
    top_k=200,  # keep only the top_k most likely tokens (None: all)
    seed=1337,
    device="auto",
    dtype="auto",
    compile=False,
)


def check_settings(cfg):
    """Every check of the sampling settings, before anything is loaded."""
    if cfg["init_from"] != "resume" and cfg["init_from"] not in PRETRAINED_SIZES:
        raise ConfigError(f"init_from must be 'resume' or one of {list(PRETRAINED_SIZES)}, got {cfg['init_from']!r}")
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


def load_model(cfg):
    """(model, encode, decode) for the run in cfg."""
    if cfg["init_from"] in PRETRAINED_SIZES:
        try:
            model = GPT.from_pretrained(cfg["init_from"], dict(dropout=0.0))
        except OSError as e:  # no network and no Hugging Face cache
            raise ConfigError(f"init_from={cfg['init_from']!r}: cannot load the pretrained weights "
                              f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
        return (model, *gpt2_codec())
    checkpoint = load_checkpoint(cfg["out_dir"])
    model = build_model_from_checkpoint(checkpoint, dropout=0.0)
    # the dataset's vocabulary, as nanoGPT finds it: data/<dataset>/ (this repo's runs may name a data_dir)
    run = checkpoint.get("config") or {}
    data_dir = run.get("data_dir") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                                                    str(run.get("dataset", "")))
    vocab = load_vocab(data_dir) if run.get("dataset") and os.path.isdir(data_dir) else None
    if vocab is not None:
        print(f"loading {data_dir}'s vocabulary")
        stoi, itos = vocab["stoi"], vocab["itos"]
        unknown = "".join(sorted({c for c in cfg["start"] if c not in stoi}))
        if unknown:
            raise ConfigError(f"start has characters not in the dataset's vocabulary: {unknown!r}")
        return model, (lambda s: [stoi[c] for c in s]), (lambda ids: "".join(itos[i] for i in ids))
    if model.config.vocab_size < 50257:
        raise ConfigError(f"the checkpoint's vocab_size is {model.config.vocab_size}, smaller than GPT-2's, and its "
                          f"dataset's vocabulary (meta.json or meta.pkl in {data_dir}) is not there")
    return (model, *gpt2_codec())


def gpt2_codec():
    from data.tokenizer import gpt2_encoding

    enc = gpt2_encoding()
    return (lambda s: enc.encode(s, allowed_special={"<|endoftext|>"})), enc.decode


@exit_on_config_error
def main(argv):
    cfg = configure(DEFAULTS, argv)
    check_settings(cfg)
    cfg["start"] = read_prompt(cfg["start"])
    device = pick_device(cfg["device"])
    device_type = "cuda" if device.startswith("cuda") else device
    dtype = pick_dtype(cfg["dtype"], device_type)
    model, encode, decode = load_model(cfg)
    setup_runtime(device_type, cfg["seed"])
    model.eval().to(device)
    if cfg["compile"]:
        model = torch.compile(model)
    x = torch.tensor(encode(cfg["start"]), dtype=torch.long, device=device)[None, ...]
    with torch.no_grad(), autocast_context(device_type, dtype):
        for _ in range(cfg["num_samples"]):
            y = model.generate(x, cfg["max_new_tokens"], temperature=cfg["temperature"], top_k=cfg["top_k"])
            print(decode(y[0].tolist()))
            print("---------------")


if __name__ == "__main__":
    main(sys.argv[1:])
