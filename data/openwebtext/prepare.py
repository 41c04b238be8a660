"""
Prepare OpenWebText with GPT-2 BPE tokens, as in nanoGPT; or local text files with --input.
Writes train.bin (~17GB for OpenWebText, ~9B tokens) and val.bin (~8.5MB, ~4M tokens), uint16 ids.
Each document ends with the end-of-text token 50256. With --input, a document is a paragraph:
the text between blank lines (datasets' "text" loader, sample_by="paragraph"); this works offline.
Without --input and without a reachable Hugging Face hub it stops in one line (exit 2), unless
HF_DATASETS_OFFLINE=1 says to use a copy already in the cache.

  python data/openwebtext/prepare.py --num_proc 8
  python data/openwebtext/prepare.py --input a.txt b.txt --out_dir /tmp/owt --num_proc 1
"""
import os
import sys

import numpy as np
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # repo root
from data.sources import ArgumentParser, check_args, hub_problem
from data.tokenizer import gpt2_encoding


def main():
    parser = ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--input", nargs="+", help="local text files (default: OpenWebText from the Hugging "
                        "Face hub)")
    parser.add_argument("--num_proc", type=int, default=min(8, os.cpu_count()),
                        help="workers for loading and tokenizing; good is about half the CPU cores")
    parser.add_argument("--out_dir", default=os.path.dirname(os.path.abspath(__file__)))
    args = parser.parse_args()
    if args.num_proc < 1:
        parser.error(f"--num_proc {args.num_proc}: must be at least 1")
    check_args(parser, args)
    # huggingface datasets: 2-3 s to import, so after the arguments are checked
    from datasets import load_dataset

    if args.input:
        dataset = load_dataset("text", data_files=args.input, sample_by="paragraph")
        if dataset["train"].num_rows < 2:  # the val split takes one document and leaves the rest to train
            parser.error(f"--input {' '.join(args.input)}: {dataset['train'].num_rows} document(s); a train "
                         "and " f"a val split need at least 2 (documents are paragraphs: text between blank "
                         "lines)")
    else:
        # takes 54GB in the huggingface cache dir, about 8M documents (8,013,769).
        # datasets >= 4 refuses the hub's loading script for openwebtext (see nanoGPT issue #633)
        offline = os.environ.get("HF_DATASETS_OFFLINE", "") not in ("", "0")
        problem = None if offline else hub_problem()
        try:
            if problem is None:
                dataset = load_dataset("openwebtext", num_proc=args.num_proc)
        except ConnectionError as e:  # the hub answered, the dataset did not come (or offline and not cached)
            problem = str(e)
        if problem is not None:
            print(f"{parser.prog}: error: cannot get OpenWebText from the Hugging Face hub ({problem}); to "
                  "prepare " f"local text offline, use --input FILE [FILE ...]", file=sys.stderr)
            sys.exit(2)

    # owt by default only contains the 'train' split, so create a test split
    split_dataset = dataset["train"].train_test_split(test_size=0.0005, seed=2357, shuffle=True)
    split_dataset["val"] = split_dataset.pop("test")  # rename the test split to val

    enc = gpt2_encoding()

    def process(example):
        ids = enc.encode_ordinary(example["text"])  # encode_ordinary ignores any special tokens
        ids.append(enc.eot_token)  # add the end of text token, e.g. 50256 for gpt2 bpe
        return {"ids": ids, "len": len(ids)}

    # tokenize the dataset
    tokenized = split_dataset.map(process, remove_columns=["text"], desc="tokenizing the splits",
                                  num_proc=args.num_proc)

    # concatenate all the ids in each dataset into one large file we can use for training
    for split, dset in tokenized.items():
        arr_len = np.sum(dset["len"], dtype=np.uint64)
        print(f"{split} has {arr_len:,} tokens in {len(dset):,} documents")
        filename = os.path.join(args.out_dir, f"{split}.bin")
        # uint16 is enough since enc.max_token_value == 50256 is < 2**16
        arr = np.memmap(filename, dtype=np.uint16, mode="w+", shape=(arr_len,))
        total_batches = min(1024, len(dset))  # an empty shard would break np.concatenate

        idx = 0
        for batch_idx in tqdm(range(total_batches), desc=f"writing {filename}"):
            # batch together samples for faster write
            batch = dset.shard(num_shards=total_batches, index=batch_idx,
                               contiguous=True).with_format("numpy")
            arr_batch = np.concatenate(batch["ids"])
            # write into mmap
            arr[idx: idx + len(arr_batch)] = arr_batch
            idx += len(arr_batch)
        arr.flush()


if __name__ == "__main__":
    main()
