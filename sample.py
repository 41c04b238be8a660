"""
Sample from a trained model: a checkpoint in out_dir (GPT or DistributedGPT, rebuilt with the checkpoint's own
tp_size and block_types, simulated on one device) or a pretrained GPT-2.
$ python sample.py --out_dir=out-shakespeare-char
$ python sample.py --init_from=gpt2-xl --start="What is the answer to life?" --num_samples=3
$ python sample.py --out_dir=out-gpt2 --start=FILE:prompt.txt
"""

import os
import pickle
import sys

import torch

from common import autocast_context, build_model, load_checkpoint, pick_device, pick_dtype, setup_runtime
from configurator import ConfigError, configure, exit_on_config_error
from model import GPT, PRETRAINED_SIZES

DEFAULTS = dict(
    init_from="resume",  # 'resume' (from out_dir) or a GPT-2 variant: 'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl'
    out_dir="out",
    start="\n",  # the prompt, or "FILE:path.txt"
    num_samples=10,
    max_new_tokens=500,
    temperature=0.8,  # 1.0 = no change, < 1.0 = less random
    top_k=200,  # keep only the top_k most likely tokens (None: all)
    seed=1337,
    device="auto",
    dtype="auto",
    compile=False,
)


def load_model(cfg):
    """(model, encode, decode) for the run in cfg."""
    if cfg["init_from"] in PRETRAINED_SIZES:
        try:
            model = GPT.from_pretrained(cfg["init_from"], dict(dropout=0.0))
        except OSError as e:  # no network and no Hugging Face cache
            raise ConfigError(f"init_from={cfg['init_from']!r}: cannot load the pretrained weights ({e})") from e
        return (model, *gpt2_codec())
    if cfg["init_from"] != "resume":
        raise ConfigError(f"init_from must be 'resume' or one of {list(PRETRAINED_SIZES)}, got {cfg['init_from']!r}")
    checkpoint = load_checkpoint(cfg["out_dir"])
    model_args = dict(checkpoint["model_args"], dropout=0.0)
    model = build_model(checkpoint.get("model_type", "gpt"), model_args)
    if hasattr(model, "load_gpt_state_dict"):
        model.load_gpt_state_dict(checkpoint["model"])
    else:
        model.load_state_dict(checkpoint["model"])
    run = checkpoint.get("config", {})
    data_dir = run.get("data_dir") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                                                    run.get("dataset", ""))
    meta_path = os.path.join(data_dir, "meta.pkl")
    if run.get("dataset") and os.path.isfile(meta_path):
        print(f"loading {meta_path}")
        with open(meta_path, "rb") as f:
            meta = pickle.load(f)
        stoi, itos = meta["stoi"], meta["itos"]
        unknown = "".join(sorted({c for c in cfg["start"] if c not in stoi}))
        if unknown:
            raise ConfigError(f"start has characters not in the dataset's vocabulary: {unknown!r}")
        return model, (lambda s: [stoi[c] for c in s]), (lambda ids: "".join(itos[i] for i in ids))
    return (model, *gpt2_codec())


def gpt2_codec():
    from data.tokenizer import gpt2_encoding

    enc = gpt2_encoding()
    return (lambda s: enc.encode(s, allowed_special={"<|endoftext|>"})), enc.decode


@exit_on_config_error
def main(argv):
    cfg = configure(DEFAULTS, argv)
    if cfg["start"].startswith("FILE:"):
        path = cfg["start"][5:]
        if not os.path.isfile(path):
            raise ConfigError(f"start: no such file {path!r}")
        with open(path, encoding="utf-8") as f:
            cfg["start"] = f.read()
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
