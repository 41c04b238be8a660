"""The Linux kernel's C source as a character corpus (data/linux/prepare.py; docs/data.md "Linux"): the pinned
Debian tarball, the files taken from it and their order, the fixed vocabulary, and the compact form that
travels to a GPU machine (pack) and becomes train.bin/val.bin there (unpack).

Order and split: every `.c` and `.h` file whose text is all in VOCAB, ordered by the sha256 of its path inside
the tarball (a fixed shuffle, so both splits sample the whole tree, not arch/ first), concatenated. val.bin is
the first val_tokens characters of that stream, train.bin the next train_tokens. Only the files with the
smallest hashes are kept while reading, so memory stays near the size of the output, not the 1.3 GB of source.
"""

import hashlib
import heapq
import io
import json
import os
import sys
import tarfile

import numpy as np
from tqdm import tqdm

from data.vocab import write_vocab

PACKAGE, VERSION = "linux-source-6.12", "6.12.117-1~deb12u1"  # Debian 12 (bookworm) security update
TARBALL = "/usr/src/linux-source-6.12.tar.xz"  # what that package installs
TARBALL_SHA256 = "585a4a074597aefa2b1a68ada83a3184ba351c127544dea80618bbcceaa3961f"
INSTALL = f"apt-get update && apt-get install -y {PACKAGE}"
SUFFIXES = (".c", ".h")
# tab, newline, printable ASCII: 97 characters, fixed
VOCAB = "\t\n" + "".join(chr(c) for c in range(32, 127))
VAL_TOKENS, TRAIN_TOKENS = 5_000_000, 300_000_000  # docs/data.md: why these sizes
COMPACT = "linux-char.tar.xz"  # the compact form's file name, in the dataset's directory

_LUT = np.full(256, 65535, dtype=np.uint16)  # byte -> id; 65535 marks a byte outside VOCAB
_LUT[np.frombuffer(VOCAB.encode("ascii"), dtype=np.uint8)] = np.arange(len(VOCAB), dtype=np.uint16)


def sha256_file(path, chunk=1 << 22):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def encode(data):
    """uint16 ids of ASCII bytes (VOCAB only; raises ValueError naming the first byte outside it)."""
    ids = _LUT[np.frombuffer(data, dtype=np.uint8)]
    bad = np.flatnonzero(ids == 65535)
    if bad.size:
        raise ValueError(f"byte {data[bad[0]]!r} at offset {bad[0]} is not in the corpus vocabulary")
    return ids


def in_vocab(data):
    return not (_LUT[np.frombuffer(data, dtype=np.uint8)] == 65535).any()


def path_key(name):
    """A file's place in the order: the sha256 of its path below the tarball's top directory."""
    return hashlib.sha256(name.split("/", 1)[-1].encode("utf-8")).digest()


def select(files, need, *, progress=None):
    """(kept files in order, files left out for characters outside VOCAB): of (name, bytes) pairs, the
    in-vocabulary ones with the smallest path keys whose sizes add up to at least `need` (all of them
    when they add up to less)."""
    heap, total, dropped = [], 0, 0  # heap: (-key, name, data), the largest key on top
    for name, data in files:
        if progress is not None:
            progress.update(1)
        if not in_vocab(data):
            dropped += 1
            continue
        heapq.heappush(heap, (tuple(-b for b in path_key(name)), name, data))
        total += len(data)
        while heap and total - len(heap[0][2]) >= need:  # the largest key is not needed to reach `need`
            total -= len(heapq.heappop(heap)[2])
    kept = sorted(((name, data) for _, name, data in heap), key=lambda f: path_key(f[0]))
    return kept, dropped


def tarball_files(path):
    """(name, bytes) of each .c/.h file of the tarball, streamed (one pass of xz decompression)."""
    with tarfile.open(path, "r|xz") as tar:
        for member in tar:
            if member.isfile() and member.name.endswith(SUFFIXES):
                yield member.name, tar.extractfile(member).read()


def local_files(paths):
    for path in paths:
        with open(path, "rb") as f:
            yield path, f.read()


def split_stream(kept, *, val_tokens, train_tokens):
    """(val bytes, train bytes) of the kept files' stream; val is at most a tenth of it (small --input)."""
    stream = b"".join(data for _, data in kept)
    n_val = min(val_tokens, len(stream) // 10)
    return stream[:n_val], stream[n_val:n_val + train_tokens]


def write_atomic(path, data):
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def write_dataset(out_dir, val, train, source):
    """train.bin, val.bin (uint16), meta.json/meta.pkl (VOCAB) and source.json, each written atomically."""
    for split, text in (("train", train), ("val", val)):
        write_atomic(os.path.join(out_dir, f"{split}.bin"), encode(text).tobytes())
    write_vocab(out_dir, VOCAB)
    write_atomic(os.path.join(out_dir, "source.json"), json.dumps(source, indent=2).encode())


def source_info(source, val, train, *, files, dropped):
    return dict(source, files=files, files_left_out=dropped, vocab_size=len(VOCAB),
                val_tokens=len(val), train_tokens=len(train),
                # of the characters, as the Shakespeare data's
                sha256=hashlib.sha256(val + train).hexdigest())


def pack(path, val, train, source):
    """The compact form: one xz tar of source.json, val.txt and train.txt (C source compresses about 10x)."""
    with tarfile.open(path + ".tmp", "w:xz", preset=3) as tar:
        for name, data in (("source.json", json.dumps(source, indent=2).encode()), ("val.txt", val),
                           ("train.txt", train)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    os.replace(path + ".tmp", path)


def unpack(path, out_dir, *, say=print):
    """train.bin/val.bin/meta/source.json in out_dir from the compact form, its text checked
    against the sha256 it records. Only the three known members are read (as bytes; nothing is
    extracted to disk by name)."""
    say(f"unpacking {path} into {out_dir}")
    try:
        with tarfile.open(path, "r:xz") as tar:
            members = {}
            for name in ("source.json", "val.txt", "train.txt"):
                file = tar.extractfile(name) if name in tar.getnames() else None
                if file is None:  # missing, or a folder or link of that name
                    raise ValueError(f"{path}: the compact form has no file {name}")
                members[name] = file.read()
        source = json.loads(members["source.json"])
    except (tarfile.TarError, EOFError, OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a compact corpus (an xz tar of source.json, val.txt, train.txt): "
                         f"{type(e).__name__}: {e}") from None
    if not isinstance(source, dict):
        raise ValueError(f"{path}: its source.json must be an object, got {type(source).__name__}")
    val, train = members["val.txt"], members["train.txt"]
    if not val or len(train) < 2:
        raise ValueError(f"{path}: its text ({len(val)} val, {len(train)} train characters) makes no dataset")
    got = hashlib.sha256(val + train).hexdigest()
    if got != source.get("sha256"):
        raise ValueError(f"{path}: the text's sha256 is {got}, its source.json says {source.get('sha256')}")
    os.makedirs(out_dir, exist_ok=True)
    write_dataset(out_dir, val, train, source)
    say(f"wrote {len(train):,} train and {len(val):,} val tokens")
    return source


def prepare(files, out_dir, source, *, n_files=None, val_tokens=VAL_TOKENS, train_tokens=TRAIN_TOKENS,
            compact=None):
    """Select, split, write the dataset (and the compact form when `compact` is a path);
    returns source.json's dict."""
    # a progress bar on a terminal only: a log gets no carriage returns
    with tqdm(total=n_files, desc="reading files", unit="file", disable=not sys.stderr.isatty()) as bar:
        kept, dropped = select(files, val_tokens + train_tokens, progress=bar)
    val, train = split_stream(kept, val_tokens=val_tokens, train_tokens=train_tokens)
    if not val or len(train) < 2:
        raise ValueError(f"{sum(len(d) for _, d in kept)} character(s) in {len(kept)} usable file(s) cannot "
                         "be " f"split into a train and a val split")
    info = source_info(source, val, train, files=len(kept), dropped=dropped)
    write_dataset(out_dir, val, train, info)
    if compact:
        pack(compact, val, train, info)
    return info
