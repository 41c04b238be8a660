"""
The training data: train.bin and val.bin (uint16 token ids, nanoGPT's format), checked before a run starts
(check_data), and the batches a run reads from them (Batches), seeded per (iteration, micro-batch).
"""

import os

import numpy as np
import torch

from tpcomm.errors import ConfigError

FULL_SCAN_TOKENS = 128 << 20  # data files up to this many tokens are scanned whole for their largest id


def check_data(cfg, data_dir, vocab_size):
    """train.bin and val.bin: present, whole uint16 tokens, longer than a block, every id < vocab_size. Files
    up to FULL_SCAN_TOKENS tokens are scanned whole for their largest id; larger ones (OpenWebText) in 1024
    evenly spaced chunks of 64K tokens, a sample that catches a wrong tokenizer but not a single stray id."""
    for split in ("train", "val"):
        path = os.path.join(data_dir, f"{split}.bin")
        if not os.path.isfile(path):
            raise ConfigError(f"dataset {cfg['dataset']!r}: {path} not found "
                              f"(run python data/{cfg['dataset']}/prepare.py)")
        size = os.path.getsize(path)
        if size % 2:
            raise ConfigError(f"dataset {cfg['dataset']!r}: {path} has an odd number of bytes ({size}); "
                              f"token files hold uint16 ids (2 bytes each): truncated or not a token file")
        n = size // 2
        if n <= cfg["block_size"] + 1:
            raise ConfigError(f"dataset {cfg['dataset']!r}: {split}.bin has {n} tokens, "
                              f"fewer than block_size+2 ({cfg['block_size'] + 2})")
        data = np.memmap(path, dtype=np.uint16, mode="r")
        if n <= FULL_SCAN_TOKENS:
            top = int(data.max())
        else:
            chunk = 1 << 16
            top = max(int(data[s:s + chunk].max()) for s in np.linspace(0, n - chunk, 1024).astype(np.int64))
        if top >= vocab_size:
            raise ConfigError(f"dataset {cfg['dataset']!r}: {path} holds token id {top}, but the model's "
                              f"vocab_size is {vocab_size}")


class Batches:
    """Random crops from a uint16 memmap. Each (iteration, micro-step) has its own seed, so a resumed run
    and a run split over data-parallel ranks see exactly the batches of one uninterrupted process."""

    def __init__(self, data_dir, *, block_size, batch_size, seed, device):
        self.data_dir, self.block_size, self.batch_size = data_dir, block_size, batch_size
        self.seed, self.device = seed, device

    def get(self, split, it, micro):
        # recreate the memmap every batch to avoid a memory leak (nanoGPT issue)
        data = np.memmap(os.path.join(self.data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
        key = [self.seed, {"train": 0, "val": 1}[split], it + 1, micro]  # it = -1 for evaluation
        g = torch.Generator().manual_seed(int(np.random.SeedSequence(key).generate_state(1)[0]))
        ix = torch.randint(len(data) - self.block_size - 1, (self.batch_size,), generator=g)
        x = torch.stack([torch.from_numpy(data[i:i + self.block_size].astype(np.int64)) for i in ix.tolist()])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + self.block_size].astype(np.int64))
                         for i in ix.tolist()])
        if self.device.startswith("cuda"):
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device,
                                                                                        non_blocking=True)
        return x.to(self.device), y.to(self.device)
