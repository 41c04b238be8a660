"""
A character dataset's vocabulary, stored as data. prepare.py writes meta.json (read here) and, for nanoGPT's
own scripts, meta.pkl. An old meta.pkl is read through an unpickler that refuses every global, so a crafted
file can hold only plain values (dicts, lists, strings, numbers) and never runs code.
"""

import io
import json
import os
import pickle

from tpcomm.errors import ConfigError


def write_vocab(out_dir, chars):
    """meta.json ({"vocab_size", "chars"}: id i is chars[i]) and nanoGPT's
    meta.pkl for the same vocabulary."""
    chars = list(chars)
    path = os.path.join(out_dir, "meta.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"vocab_size": len(chars), "chars": chars}, f, ensure_ascii=False)
    os.replace(path + ".tmp", path)
    with open(os.path.join(out_dir, "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                     "stoi": {c: i for i, c in enumerate(chars)}}, f)


class _DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: meta.pkl may hold only plain data")


def load_vocab(data_dir):
    """{'vocab_size', 'stoi', 'itos'} of the dataset in data_dir, or None when it has no vocabulary file (BPE
    data). Raises ConfigError, naming the file, when the file is unreadable or not a vocabulary."""
    json_path, pkl_path = os.path.join(data_dir, "meta.json"), os.path.join(data_dir, "meta.pkl")
    try:
        if os.path.isfile(json_path):
            with open(json_path, encoding="utf-8") as f:
                meta = json.load(f)
            chars = meta["chars"]
            itos = dict(enumerate(chars))
            vocab_size = meta["vocab_size"]
        elif os.path.isfile(pkl_path):
            with open(pkl_path, "rb") as f:
                meta = _DataOnlyUnpickler(io.BytesIO(f.read())).load()
            itos, vocab_size = meta["itos"], meta["vocab_size"]
            itos = {int(i): c for i, c in itos.items()}
        else:
            return None
        if not (isinstance(vocab_size, int) and vocab_size >= len(itos) > 0
                and all(isinstance(c, str) and len(c) == 1 for c in itos.values())):
            raise ValueError("vocab_size and the characters do not agree")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError, pickle.UnpicklingError) as e:
        path = json_path if os.path.isfile(json_path) else pkl_path
        raise ConfigError(f"vocabulary file {path} is not a valid character vocabulary: {type(e).__name__}: "
                          f"{e}") from None
    return {"vocab_size": vocab_size, "itos": itos, "stoi": {c: i for i, c in itos.items()}}
