"""
nanoGPT's configurator (its configurator.py), made strict. Usage from a script with defaults in a dict:

    config = configure(defaults, sys.argv[1:])     # raises ConfigError
    python train.py config/override_file.py --batch_size=32 --block_types="['spd']*12"

Config files are Python files of plain assignments (run with exec, as in nanoGPT; they are code you chose to
run), or .json files of one object (read as data). Command-line values are parsed with ast.literal_eval plus
list repetition (`[...]*n`, `[...]+[...]`): never executed. Unknown keys, in files too, and type mismatches
are errors naming key and types (and the nearest known key, or `True`/`False` for a bool written `true`).

Shared settings: a config file may start with `from sweep_gpt2 import *` to take
every setting of config/sweep_gpt2.py (a config file itself) and then assign only
what differs. While a file runs, its own directory is first on sys.path, so this
works from any current directory. The base is run afresh on every load (it is
dropped from sys.modules afterwards, and no .pyc is written), and every value is
deep-copied, so no two configs share a mutable object. The base's keys are
checked like the file's own: an unknown key in it is an error, and a missing
base is one line, `config file ... failed: ModuleNotFoundError: ...`.
"""

import ast
import functools
import copy
import difflib
import json
import math
import os
import sys

from tpcomm.errors import ConfigError




def _literal(text):
    """ast.literal_eval, plus `list * int` and `list + list` so `['spd']*12` works. No code runs."""
    def ev(node):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add)):
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Mult) and isinstance(left, (list, tuple)) and type(right) is int:
                return left * right
            if isinstance(node.op, ast.Add) and isinstance(left, (list, tuple)) and type(left) is type(right):
                return left + right
            raise ValueError("only list*int and list+list are allowed")
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [ev(e) for e in node.elts]
            return items if isinstance(node, ast.List) else tuple(items)
        return ast.literal_eval(node)
    return ev(ast.parse(text, mode="eval").body)


def _coerce(key, value, default, nullable=()):
    """Check `value` against the default's type; int widens to float; None defaults take
    anything; None is taken only by those and the keys in `nullable` (a numeric key given None
    would fail later, inside the run)."""
    if default is None or (value is None and key in nullable):
        return value
    if value is None:
        raise ConfigError(f"{key}: expected {type(default).__name__} (default {default!r}), got None")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: expected a finite number, got {value!r}")
    if isinstance(default, bool) or isinstance(value, bool):
        if isinstance(default, bool) and isinstance(value, bool):
            return value
    elif isinstance(default, float) and isinstance(value, int):
        return float(value)
    elif isinstance(value, type(default)):
        return value
    hint = f" (write {str(value).capitalize()})" if isinstance(default, bool) and str(value).lower() in (
        "true", "false") else ""
    raise ConfigError(f"{key}: expected {type(default).__name__} (default {default!r}), "
                      f"got {type(value).__name__} {value!r}{hint}")


def parse_value(key, text):
    try:
        return _literal(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text  # a bare string, e.g. --device=cpu or --out_dir=out


def parse_flag(arg):
    """A runner's on/off flag: `--name` is True; `--name=True` / `--name=False` parse as every other key's
    value does. Anything else is a ConfigError naming the flag and the value."""
    if "=" not in arg:
        return True
    key, text = arg.lstrip("-").split("=", 1)
    value = parse_value(key, text)
    if not isinstance(value, bool):
        raise ConfigError(f"--{key} is a flag: give --{key}, --{key}=True or --{key}=False, got {text!r}")
    return value


def _read_config_file(path):
    """A config file's names: a .json file is data (a JSON object of key: value), anything else is Python that
    nanoGPT's configurator runs (_run_config_file)."""
    if not path.endswith(".json"):
        return _run_config_file(path)
    try:
        return read_json_object(path)
    except ValueError as e:
        raise ConfigError(f"config file {path!r}: {e}") from None


def read_json_object(path):
    """The JSON object in a file, read as data; a ValueError saying why not (unreadable, not JSON, not an
    object)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not readable as JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    return data


def _run_config_file(path):
    """exec a config file with its directory first on sys.path, so `from sweep_gpt2 import *` finds
    a base config beside it; modules imported from that directory are forgotten afterwards."""
    here = os.path.dirname(os.path.abspath(path))
    before = set(sys.modules)
    scope = {"__file__": path}
    sys.path.insert(0, here)
    dont_write_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        with open(path) as f:
            exec(compile(f.read(), path, "exec"), scope)
    except (Exception, SystemExit) as e:  # a broken config file (or one that calls sys.exit) is a user error
        raise ConfigError(f"config file {path!r} failed: {type(e).__name__}: {e}") from None
    finally:
        sys.dont_write_bytecode = dont_write_bytecode
        sys.path.remove(here)  # the first occurrence: the one inserted above
        for name in set(sys.modules) - before:
            origin = getattr(sys.modules[name], "__file__", None)
            if origin and os.path.dirname(os.path.abspath(origin)) == here:
                del sys.modules[name]
    return scope


def nearest(key, known):
    """'; did you mean 'max_iters'?' for the closest known key, or ''."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
    return f"; did you mean {close[0]!r}?" if close else ""


def usage(defaults):
    """--help: the running script's docstring, then every key with its default."""
    doc = (sys.modules["__main__"].__doc__ or "").strip()
    keys = "\n".join(f"  --{k}={v!r}" for k, v in defaults.items())
    return f"{doc}\n\nkeys (--key=value, after any config files), with their defaults:\n{keys}"


def configure(defaults, argv, *, nullable=(), scopes=None):
    """Return a new dict: defaults updated by config files then --key=value arguments, in order.
    --help (or -h) prints usage(defaults) and exits 0. nullable: keys with a non-None default that
    also take None. scopes: a dict the caller keeps to run each config file once over many calls (a
    sweep's plan: {path: its names})."""
    config = dict(defaults)
    if "--help" in argv or "-h" in argv:
        try:
            print(usage(defaults))
        except BrokenPipeError:  # `--help | head`
            sys.stdout = None
        sys.exit(0)
    for arg in argv:
        if not arg.startswith("--"):
            if not os.path.isfile(arg):
                raise ConfigError(f"config file {arg!r} not found")
            if scopes is None:
                scope = _read_config_file(arg)
            else:
                if arg not in scopes:
                    scopes[arg] = _read_config_file(arg)
                scope = scopes[arg]
            for key, value in scope.items():
                if key.startswith("_") or callable(value) or type(value).__name__ == "module":
                    continue
                if key not in config:
                    raise ConfigError(f"unknown config key {key!r} in {arg}{nearest(key, config)}")
                config[key] = _coerce(key, copy.deepcopy(value), defaults[key], nullable)
        else:
            if "=" not in arg:
                raise ConfigError(f"argument {arg!r} must look like --key=value")
            key, text = arg[2:].split("=", 1)
            if key not in config:
                raise ConfigError(f"unknown config key {key!r} (from {arg}){nearest(key, config)}")
            value = parse_value(key, text)
            if isinstance(defaults[key], str) and not isinstance(value, str):
                value = text  # --out_dir=123 is still a path
            config[key] = _coerce(key, value, defaults[key], nullable)
    return config


def save_config(config, out_dir, name="config.json"):
    """Write the resolved config next to the run's outputs (temp file, then rename)."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    with open(path + ".tmp", "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    os.replace(path + ".tmp", path)


def exit_in_one_line(error, status):
    """A decorator for script mains: an `error` exception becomes one line on stderr
    and exit status `status`."""
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except error as e:
                # one write per line: under torchrun the ranks' identical lines do not interleave
                sys.stderr.write(f"error: {e}\n")
                sys.stderr.flush()
                sys.exit(status)
        return wrapper
    return decorate


exit_on_config_error = exit_in_one_line(ConfigError, 2)  # a user error in the configuration
