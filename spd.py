"""
Converting a trained checkpoint's blocks to cheaper-to-communicate ones, the block type chosen by --block:

--block=spd (the default): Sync-Point Drop (arXiv 2502.20727): per-block sensitivity, distillation, the
converted model (the machinery: tpcomm/convert/sync_point_drop.py). --block=ladder: Ladder Residual (arXiv
2501.06589): the upper half of the blocks 'ladder', zero-shot, then a short retraining
(tpcomm/convert/ladder_conversion.py).

$ python spd.py --out_dir=out-shakespeare-char --tp_size=4
$ python sample.py --out_dir=out-shakespeare-char/spd       # the converted model
$ python spd.py --block=ladder --out_dir=out-shakespeare-char --tp_size=4 --retrain_steps=200
$ python sample.py --out_dir=out-shakespeare-char/ladder
"""

import sys

from tpcomm.errors import ConfigError
from tpcomm.configuration import exit_on_config_error
from tpcomm.convert import ladder_conversion, sync_point_drop

# --block=NAME -> (the conversion's keys with their defaults, its main)
CONVERSIONS = {"spd": (sync_point_drop.DEFAULTS, sync_point_drop.main),
               "ladder": (ladder_conversion.DEFAULTS, ladder_conversion.main)}


def split_block(argv):
    """(the --block given, default 'spd'; the last one wins, the other arguments):
    the conversion's own keys."""
    blocks = [a.split("=", 1)[1] for a in argv if a.startswith("--block=")]
    block = blocks[-1] if blocks else "spd"
    if block not in CONVERSIONS:
        raise ConfigError(f"block must be one of {list(CONVERSIONS)}, got {block!r}")
    return block, [a for a in argv if not a.startswith("--block=")]


@exit_on_config_error
def main(argv):
    block, rest = split_block(argv)
    CONVERSIONS[block][1](rest)


if __name__ == "__main__":
    main(sys.argv[1:])
