"""
The one validator of result files, for every reader (`experiment.py report`, `report --check`, the
sweeps' own reports, `experiment.py gpu-node --report-only`): a file's name, its `run`, `sweep` and
`seed` agree, and every value a table or a plot reads is finite and in range. A file that fails is a
ResultsError naming the file, the key and the value (one line). Further checks of a result file (what
commit wrote it, ...) go beside check_result.
"""

import math
import os
import re

from tpcomm.errors import ConfigError
from tpcomm.model.block_types.registry import type_options
from tpcomm.model.options import expand_block_types

RUN_FILE = re.compile(r"(.+)-seed(\d+)\.json")  # a sweep's runs/<run>-seed<S>.json
# nats: a uniform guess over GPT-2's vocabulary is ln(50304) = 10.8; far above is a broken file
LOSS_MAX = 100.0
NODE_WAY_FIELDS = ("ms_per_iter", "tokens_per_s", "in_collectives_ms", "exposed_ms")


class ResultsError(ValueError):
    """A run directory or result file that cannot be read as results (corrupt JSON, wrong types, values out of
    range, a name that disagrees with its contents): one line naming the file."""


def _number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _in_range(path, key, value, low, high=math.inf, *, low_open=False):
    ok = _number(value) and math.isfinite(value) and (value > low if low_open
                                                      else value >= low) and value <= high
    if not ok:
        bound = f"{'>' if low_open else '>='} {low}" + (f" and <= {high}" if high != math.inf else "")
        raise ResultsError(f"{path}: {key} must be a finite number {bound}, got {value!r}")


def check_result(path, record, *, sweep=None):
    """A sweep's result file (its types checked by results.read_record): the name <run>-seed<S>.json agrees
    with `run`, `seed` and the config's seed, `sweep` is the sweep reading it (when given), and the losses,
    tokens and times are in range."""
    m = RUN_FILE.fullmatch(os.path.basename(path))
    if m is None:
        raise ResultsError(f"{path}: not a result file name (<run>-seed<S>.json)")
    if record["run"] != m.group(1):
        raise ResultsError(f"{path}: its 'run' is {record['run']!r}, its name says {m.group(1)!r}")
    if record["seed"] != int(m.group(2)) or record["config"].get("seed") != record["seed"]:
        raise ResultsError(f"{path}: its 'seed' is {record['seed']!r} (config seed "
                           f"{record['config'].get('seed')!r}), its name says {int(m.group(2))}")
    if sweep is not None and record["sweep"] != sweep:
        raise ResultsError(f"{path}: its 'sweep' is {record['sweep']!r}, read as a result of sweep {sweep!r}")
    _in_range(path, "val_loss", record["val_loss"], 0.0, LOSS_MAX)
    for i, (it, tokens, loss) in enumerate(record["val_curve"]):
        _in_range(path, f"val_curve[{i}] loss", loss, 0.0, LOSS_MAX)
        _in_range(path, f"val_curve[{i}] iter", it, 0)
        _in_range(path, f"val_curve[{i}] tokens", tokens, 0)
    _in_range(path, "tokens_per_iter", record["tokens_per_iter"], 0, low_open=True)
    _in_range(path, "tokens", record["tokens"], 0)
    for key, fields in (("machine", ("cpu", "cpu_capability", "torch")), ("data", ("sha256",))):
        part = record.get(key)
        if part is not None and not isinstance(part, dict):
            raise ResultsError(f"{path}: {key!r} must be an object, got {part!r}")
        for field in fields:
            value = (part or {}).get(field)
            if value is not None and not isinstance(value, str):
                raise ResultsError(f"{path}: {key} {field} must be a string, got {value!r}")
    git = record.get("git")
    if git is not None and not (isinstance(git, dict) and isinstance(git.get("commit"), str)
                                and isinstance(git.get("dirty", False), bool)):
        raise ResultsError(f"{path}: 'git' must name its commit (a string) and whether the tree was dirty, "
                           "got " f"{git!r}")
    check_type_options(path, record["config"])
    for key in ("step_ms", "wall_s", "tokens_per_s"):
        if record["timing"].get(key) is not None:
            _in_range(path, f"timing {key}", record["timing"][key], 0.0, low_open=True)


def run_kinds(cfg):
    """The block types of a run's config, one per layer ([] for a GPT)."""
    if cfg.get("model_type", "gpt") != "distributed_gpt":
        return []
    return expand_block_types(cfg.get("block_types"), cfg.get("n_layer"))


def check_type_options(path, cfg):
    """The block types' own options in a run's config (caat_sync_fraction), as train.py checks them."""
    try:
        type_options(cfg, run_kinds(cfg), n_embd=cfg.get("n_embd"), tp_size=cfg.get("tp_size", 1))
    except (ConfigError, ValueError, TypeError) as e:
        raise ResultsError(f"{path}: config {e}") from None


def check_node_result(path, record, *, shape):
    """A gpu-node result file (runs/<shape>.json): a JSON object whose config names `shape`, every way's times
    finite and positive, its counts ints >= 0."""
    config = record.get("config")
    if not isinstance(config, dict) or config.get("shape") != shape:
        got = config.get("shape") if isinstance(config, dict) else config
        raise ResultsError(f"{path}: its config must name shape {shape!r}, got {got!r}")
    for key in ("machine", "ways", "allreduce_sanity"):
        if not isinstance(record.get(key), dict):
            raise ResultsError(f"{path}: {key!r} must be an object, got {record.get(key)!r}")
    if not isinstance(record.get("errors", {}), dict):
        raise ResultsError(f"{path}: 'errors' must be an object, got {record.get('errors')!r}")
    for name, way in record["ways"].items():
        if not isinstance(way, dict):
            raise ResultsError(f"{path}: way {name!r} must be an object, got {way!r}")
        for key in NODE_WAY_FIELDS:
            _in_range(path, f"{name} {key}", way.get(key), 0.0, low_open=key in ("ms_per_iter",
                                                                                 "tokens_per_s"))
        for key in ("fwd_allreduces", "fwd_reduce_scatters", "fwd_all_gathers"):
            v = way.get(key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ResultsError(f"{path}: {name} {key} must be an int >= 0, got {v!r}")
    sanity = record["allreduce_sanity"]
    if "error" not in sanity:
        for key in ("in_collective_ms", "step_ms", "floor_ms"):
            _in_range(path, f"allreduce_sanity {key}", sanity.get(key), 0.0)


def stray_files(folders, known):
    """The entries of `folders` (a sweep's runs/ directories) that are not among `known` result paths: files
    with another name, folders, anything a report would otherwise pass over without a word. Sorted paths."""
    known = {os.path.abspath(p) for p in known}
    return sorted(os.path.join(d, f) for d in folders if os.path.isdir(d) for f in os.listdir(d)
                  if os.path.abspath(os.path.join(d, f)) not in known)
