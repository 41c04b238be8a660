"""
PNGs that carry the digest of the numbers they draw: save_png stores the sha256 of those numbers (rounded) in
the PNG's metadata, so `python experiment.py report --check` (tpcomm/experiments/report/report.py) tells a
stale figure without drawing it. Every figure of the repository is saved through here.
"""

import hashlib
import json
import os

from tpcomm.train.output_path import MARK


def _rounded(x):
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, (list, tuple)):
        return [_rounded(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _rounded(v) for k, v in x.items()}
    return x


def data_digest(data):
    """sha256 of the plotted numbers, rounded to 6 significant digits (so float noise in the last bits of a
    mean does not count as a change)."""
    return hashlib.sha256(json.dumps(_rounded(data), sort_keys=True).encode()).hexdigest()


DIGEST_PREFIX = "report-data-sha256:"


def save_png(fig, path, data, *, made_by="report"):
    """Save fig with the digest of its data in the PNG's Description text chunk and what wrote it in its
    Software chunk (output_path.written_by: a command may replace only its own kind of figure); closes fig."""
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=120, metadata={"Description": DIGEST_PREFIX + data_digest(data),
                                         "Software": MARK + made_by})  # output_path.written_by reads it
    plt.close(fig)
    return path


def png_digest(path):
    """The data digest stored in a PNG by save_png, or None (no file, not a PNG, no digest)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            text = im.info.get("Description", "")
    except (OSError, ValueError):
        return None
    return text[len(DIGEST_PREFIX):] if text.startswith(DIGEST_PREFIX) else None


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
