"""
Prepare the Linux kernel's C source for character-level language modeling (the corpus of char-rnn's Linux
experiment), from Debian's pinned linux-source package, offline. The files, their order, the split and the
fixed 97-character vocabulary: data/linux_corpus.py; sizes and why: docs/data.md. Writes train.bin, val.bin
(uint16 ids), meta.json/meta.pkl and source.json (package, version, the tarball's sha256, the text's sha256);
with --compact also linux-char.tar.xz (~30 MB), the form that travels to a GPU machine; --unpack turns that
back into the .bin files.

  apt-get update && apt-get install -y linux-source-6.12              # /usr/src/linux-source-6.12.tar.xz,
                                                                      # ~150 MB
  python data/linux/prepare.py --compact                              # ~5 min on 2 cores; 300M train, 5M val
                                                                      # tokens
  python data/linux/prepare.py --unpack data/linux/linux-char.tar.xz  # on the GPU machine (gpu-scale does it
                                                                      # too)
  python data/linux/prepare.py --input a.c b.h --out_dir /tmp/linux   # local text files instead of the
                                                                      # tarball
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # repo root
from data import linux_corpus as lc
from data.sources import ArgumentParser, check_args


def parse(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    parser = ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--input", nargs="+", help="local text files (default: the pinned tarball)")
    parser.add_argument("--tarball", default=lc.TARBALL, help=f"the {lc.PACKAGE} tarball (sha256 checked)")
    parser.add_argument("--out_dir", default=here, help="where to write train.bin, val.bin, ...")
    parser.add_argument("--train_tokens", type=int, default=lc.TRAIN_TOKENS)
    parser.add_argument("--val_tokens", type=int, default=lc.VAL_TOKENS)
    parser.add_argument("--compact", action="store_true", help=f"also write <out_dir>/{lc.COMPACT}")
    parser.add_argument("--unpack", metavar="PATH", help="write the .bin files from a compact form instead")
    args = parser.parse_args(argv)
    for key in ("train_tokens", "val_tokens"):
        if getattr(args, key) < 1:
            parser.error(f"--{key} {getattr(args, key)}: must be at least 1")
    if args.unpack and not os.path.isfile(args.unpack):
        parser.error(f"--unpack {args.unpack!r}: no such file")
    if not args.input and not args.unpack:
        if not os.path.isfile(args.tarball):
            parser.error(f"--tarball {args.tarball!r}: no such file (install it: {lc.INSTALL})")
        digest = lc.sha256_file(args.tarball)
        if digest != lc.TARBALL_SHA256:
            parser.error(f"--tarball {args.tarball!r}: sha256 {digest} is not the pinned {lc.PACKAGE} "
                         f"{lc.VERSION}'s ({lc.TARBALL_SHA256})")
    check_args(parser, args)
    return parser, args


def main(argv=None):
    parser, args = parse(argv)
    try:
        if args.unpack:
            lc.unpack(args.unpack, args.out_dir)
            return
        if args.input:
            files, n, source = lc.local_files(args.input), len(args.input), dict(source=[os.path.abspath(p)
                                                                                         for p in args.input])
        else:
            files, n = lc.tarball_files(args.tarball), None
            source = dict(source=f"debian:{lc.PACKAGE}={lc.VERSION} {lc.TARBALL}",
                          tarball_sha256=lc.TARBALL_SHA256, files="*.c, *.h whose characters are all in the "
                          "vocabulary")
        compact = os.path.join(args.out_dir, lc.COMPACT) if args.compact else None
        info = lc.prepare(files, args.out_dir, source, n_files=n, val_tokens=args.val_tokens,
                          train_tokens=args.train_tokens, compact=compact)
    except ValueError as e:  # too little usable text, a corrupt compact form
        parser.error(str(e))
    print(f"{info['files']:,} files ({info['files_left_out']:,} left out: characters outside the "
          "vocabulary); " f"train.bin {info['train_tokens']:,} tokens, val.bin {info['val_tokens']:,} "
          "tokens, vocabulary " f"{info['vocab_size']}; in {args.out_dir}"
          + (f"; compact form {compact}" if compact else ""))


if __name__ == "__main__":
    main()
