"""
Checkpoint files: the format (GPT layout, nanoGPT-compatible both ways), atomic writes, weights_only loads,
and one-line errors for anything unreadable.
"""

import contextlib
import errno
import glob
import os
import pickle
import re
import tempfile

import torch

from tpcomm.errors import ConfigError
from model import GPT, NANOGPT_ARGS, GPTConfig
from tpcomm.train.build import build_model
from tpcomm.model.block_types.registry import BLOCK_TYPES, option_fields, option_values, type_options
from tpcomm.model.options import (FUNCTION_SYNC_OPTIONS, MODEL_TYPES, TP_COMM_OPTIONS, block_types_with,
                                  expand_block_types)
from tpcomm.train.runtime import RunError

# out_dir/ckpt.pt is a dict:
#   model, optimizer      GPT-layout state dicts, whatever model (and process layout) wrote them
#   model_args            exactly nanoGPT's GPTConfig fields (model.NANOGPT_ARGS): nanoGPT's scripts read it
#   model_type            'gpt' | 'distributed_gpt'
#   model_options         {gelu_approximate} and, for distributed_gpt, {tp_size, block_types (per layer)} and
#                         loss_parallel: True when the run sharded wte/lm_head by vocabulary (absent: False; a
#                         training choice like tp_size: the weights are GPT-layout either way);
#                         the options of the model's block types (their function), by config key:
#                         caat_sync_fraction when a block is 'caat' (tpcomm/model/block_types/caat.py)
#   iter_num, best_val_loss, config (the run's resolved configuration)
#   rng_state             CPU RNG; cuda_rng_state when the model was on CUDA; scaler (GradScaler state dict)
# Also read: nanoGPT's own checkpoints (no model_type/model_options/rng_state/scaler: a GPT with the exact
# GELU) and this repo's older ones (tp_size and block_types inside model_args).

CHECKPOINT_NAME = "ckpt.pt"


def model_spec(model_type, model):
    """(model_args, model_options) of a checkpoint of `model`: see the format above."""
    c = model.config
    model_args = {k: getattr(c, k) for k in NANOGPT_ARGS}
    model_options = {"gelu_approximate": c.gelu_approximate}
    if model_type == "distributed_gpt":
        model_options.update(tp_size=c.tp_size, block_types=list(c.block_types))
        if getattr(c, "loss_parallel", False):
            model_options["loss_parallel"] = True
        model_options.update(option_values(c.type_options))  # the model's function: 'caat' syncs p of C
    return model_args, model_options


def make_checkpoint(raw_model, optimizer, scaler, *, model_type, iter_num, best_val_loss, config,
                    tensors=True):
    """The checkpoint dict of a training run. With real tensor parallelism or FSDP gathering the GPT-layout
    state is a collective, so every rank calls this (and only the master saves). tensors=False: everything but
    the model and optimizer state, gathering nothing (a sharded checkpoint's meta.pt, see
    tpcomm/train/sharded_checkpoint.py)."""
    model_args, model_options = model_spec(model_type, raw_model)
    checkpoint = {
        "model": raw_model.gpt_state_dict() if tensors else None,
        "optimizer": raw_model.gpt_optimizer_state(optimizer) if tensors else None,
        "model_args": model_args,
        "model_type": model_type,
        "model_options": model_options,
        "iter_num": iter_num,
        "best_val_loss": best_val_loss,
        "config": config,
        "rng_state": torch.get_rng_state(),
        "scaler": scaler.state_dict(),  # {} unless fp16
    }
    if not tensors:
        del checkpoint["model"], checkpoint["optimizer"]
    device = next(raw_model.parameters()).device
    if device.type == "cuda":
        checkpoint["cuda_rng_state"] = torch.cuda.get_rng_state(device)
    return checkpoint


def checkpoint_model(checkpoint):
    """(model_type, spec) of a checkpoint in any of the formats above; spec holds nanoGPT's 7 fields,
    gelu_approximate and, for distributed_gpt, tp_size and block_types (expanded to one per layer)."""
    model_args = checkpoint["model_args"]
    model_type = checkpoint.get("model_type", "gpt")  # nanoGPT's checkpoints are GPTs
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not one of {MODEL_TYPES}")
    options = checkpoint.get("model_options")
    if options is None:  # nanoGPT's (exact GELU) or this repo's older format (tp options inside model_args)
        options = {k: model_args[k] for k in ("tp_size", "block_types") if k in model_args}
    spec = {k: model_args[k] for k in NANOGPT_ARGS if k != "dropout"}
    spec["dropout"] = model_args.get("dropout", 0.0)
    spec["gelu_approximate"] = options.get("gelu_approximate", "none")
    if model_type == "distributed_gpt":
        spec["tp_size"] = options.get("tp_size", 1)
        spec["block_types"] = expand_block_types(options.get("block_types"), spec["n_layer"])
        spec["loss_parallel"] = bool(options.get("loss_parallel", False))
        spec.update({k: options[k] for k in option_fields() if k in options})
    return model_type, spec


def checkpoint_sync_options(checkpoint):
    """The TP_COMM_OPTIONS the run that wrote a distributed_gpt checkpoint used (from its resolved config;
    only the keys it holds); {} for a 'gpt' one."""
    if checkpoint.get("model_type", "gpt") != "distributed_gpt":
        return {}
    trained = checkpoint.get("config")
    trained = trained if isinstance(trained, dict) else {}
    return {k: trained[k] for k in TP_COMM_OPTIONS if k in trained}


def check_same_function(model_type, spec, sync, *, tp_size):
    """A tp_size other than the checkpoint's is taken only where the model computes the same function at every
    tp_size: never for a 'gpt' (which has no shards: the flag would be ignored), nor for 'spd'/'parallel'
    blocks or compressed syncs (docs/model.md). ConfigError naming the values otherwise."""
    if tp_size is None or tp_size == spec.get("tp_size"):
        return
    if model_type != "distributed_gpt":
        raise ConfigError(f"tp_size={tp_size!r} has no effect: the checkpoint holds a {model_type!r} model "
                          "(no " f"tensor-parallel shards); leave tp_size unset")
    dependent = sorted(block_types_with("tp_dependent", spec["block_types"]))
    if dependent or sync.get("tp_comm_dtype") is not None:
        why = f"{dependent} blocks" if dependent else f"tp_comm_dtype={sync['tp_comm_dtype']!r}"
        raise ConfigError(f"tp_size={tp_size!r} would give another model than the one trained at tp_size="
                          f"{spec['tp_size']}: its {why} compute a function of tp_size; leave tp_size unset")


def build_model_from_checkpoint(checkpoint, *, pd=None, dropout=None, tp_size=None, loss_parallel=False):
    """The checkpoint's model with its weights: its own type, sizes, GELU, block pattern and compressed syncs
    (FUNCTION_SYNC_OPTIONS); dropout and (for distributed_gpt) loss_parallel may be changed, and tp_size where
    the function does not depend on it (check_same_function), since checkpoints are GPT-layout whatever
    tp_size wrote them. loss_parallel is off unless asked for (None: the checkpoint's), so a sampled or
    evaluated model returns (B, T, V) logits whatever the training run used."""
    model_type, spec = checkpoint_model(checkpoint)
    sync = checkpoint_sync_options(checkpoint)
    check_same_function(model_type, spec, sync, tp_size=tp_size)
    spec.update({k: v for k, v in sync.items() if k in FUNCTION_SYNC_OPTIONS})
    if dropout is not None:
        spec["dropout"] = dropout
    if tp_size is not None and model_type == "distributed_gpt":
        spec["tp_size"] = tp_size
    if loss_parallel is not None:
        spec["loss_parallel"] = loss_parallel
    model = build_model(model_type, spec, pd=pd)
    model.load_gpt_state_dict(clean_state_dict(checkpoint["model"]))
    return model


def save_checkpoint(checkpoint, out_dir):
    """Write ckpt.pt atomically: a temp file of this process's own, then a rename, so a crash or a full disk
    mid-write leaves the previous checkpoint intact. A failed write is a RunError (one line)."""
    path = os.path.join(out_dir, CHECKPOINT_NAME)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f"{CHECKPOINT_NAME}.{os.getpid()}.", suffix=".tmp")
        os.close(fd)
        torch.save(checkpoint, tmp)
        os.replace(tmp, path)
    # torch's writer reports a failed write (e.g. ENOSPC) as a RuntimeError
    except (OSError, RuntimeError) as e:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.remove(tmp)
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0][:120]
        raise RunError(f"could not write checkpoint {path}: {reason}; "
                       f"the previous checkpoint (if any) is kept") from None


TEMP_PATTERN = re.compile(re.escape(CHECKPOINT_NAME) + r"\.(\d+)\..*\.tmp$")  # save_checkpoint's temp files


def remove_stale_temp_files(out_dir):
    """Remove the temp files save_checkpoint leaves when its process is killed mid-write (ckpt.pt.<pid>.*.tmp)
    whose writer is no longer alive; a live process's file is never touched. Returns the paths removed."""
    removed = []
    for path in sorted(glob.glob(os.path.join(glob.escape(out_dir), f"{CHECKPOINT_NAME}.*.tmp"))):
        m = TEMP_PATTERN.match(os.path.basename(path))
        if m is None or pid_alive(int(m[1])):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
            removed.append(path)
    return removed


def pid_alive(pid):
    """Whether a process `pid` exists on this machine (signal 0 checks without sending anything)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError as e:
        return e.errno == errno.EPERM  # it exists, owned by another user
    return True


def load_checkpoint(out_dir, map_location="cpu"):
    """out_dir/ckpt.pt, read with weights_only (plain data and tensors only). Any unreadable, truncated, empty
    or foreign file is a ConfigError naming the path."""
    path = os.path.join(out_dir, CHECKPOINT_NAME)
    if not os.path.isfile(path):
        raise ConfigError(f"no checkpoint at {path} (out_dir={out_dir!r})")
    if os.path.getsize(path) == 0:
        raise ConfigError(f"checkpoint {path} is empty")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:  # weights_only refused a Python object
        raise ConfigError(f"checkpoint {path} holds Python objects other than plain data and tensors; "
                          f"refusing to load it") from None
    except Exception as e:  # truncated zip, junk bytes, I/O error: torch reports these with many types
        raise ConfigError(f"checkpoint {path} is corrupt or truncated, or not a PyTorch checkpoint "
                          f"({type(e).__name__})") from None
    try:
        if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("model"), dict):
            raise ValueError("no 'model' state dict")
        model_type, spec = checkpoint_model(checkpoint)
    except (KeyError, ValueError, TypeError, AttributeError) as e:
        raise ConfigError(f"checkpoint {path} is not a training checkpoint ({type(e).__name__}: "
                          f"{e})") from None
    check_type_options(model_type, spec, path)
    check_weights(checkpoint, path)
    check_fields(checkpoint, path)
    return checkpoint


def check_type_options(model_type, spec, path):
    """A checkpoint's block types' options, checked as the command line's are: a ConfigError naming the path
    and the option. A type no longer registered is left to the model's check, which names it."""
    if model_type != "distributed_gpt" or not all(kind in BLOCK_TYPES for kind in spec["block_types"]):
        return
    try:
        type_options(spec, spec["block_types"], n_embd=spec["n_embd"], tp_size=spec["tp_size"])
    except ConfigError as e:
        raise ConfigError(f"checkpoint {path}: {e}; refusing to load it") from None


RESUME_FIELDS = ("iter_num", "best_val_loss", "optimizer")  # what a resume reads beside the weights


def check_fields(checkpoint, path, *, need=()):
    """The one check of a checkpoint's fields beside its weights, shared by train.py
    (need=RESUME_FIELDS), sample.py, export and the sharded loader: each present field has its type and
    range, each needed one is there. A ConfigError naming the path, the field and its value otherwise,
    before anything is built or written."""
    def bad(field, what):
        shown = (type(checkpoint[field]).__name__ if torch.is_tensor(checkpoint[field])
                 else repr(checkpoint[field]))
        return ConfigError(f"checkpoint {path}: {field}={shown[:60]} is not {what}; refusing to load it")

    missing = [k for k in need if k not in checkpoint]
    if missing:
        raise ConfigError(f"checkpoint {path} has no {missing[0]!r}, which a resume needs; refusing to load "
                          "it")
    number = (int, float)
    value = checkpoint.get("iter_num", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad("iter_num", "an iteration (an int >= 0)")
    value = checkpoint.get("best_val_loss", 0.0)
    value = value.item() if torch.is_tensor(value) and value.numel() == 1 else value  # nanoGPT saves a tensor
    if isinstance(value, bool) or not isinstance(value, number) or value != value:
        raise bad("best_val_loss", "a loss (a number)")
    optimizer = checkpoint.get("optimizer", {"state": {}, "param_groups": []})
    if not (isinstance(optimizer, dict) and isinstance(optimizer.get("state"), dict)
            and isinstance(optimizer.get("param_groups"), list)
            and all(isinstance(g, dict) for g in optimizer["param_groups"])):
        raise bad("optimizer", "an optimizer state (a dict of 'state' and 'param_groups')")
    rng = checkpoint.get("rng_state", torch.get_rng_state())
    if not (torch.is_tensor(rng) and rng.dtype == torch.uint8 and rng.shape == torch.get_rng_state().shape):
        raise bad("rng_state", "torch's random state")
    for field, kind, what in (("config", dict, "a run's config (a dict)"),
                              ("scaler", dict, "a loss scaler's state"), ("vocab_chars", str, "a vocabulary "
                                                                          "(a str)")):
        if field in checkpoint and not isinstance(checkpoint[field], kind):
            raise bad(field, what)


def check_weights(checkpoint, path):
    """A checkpoint's config (model_args) must describe its weights: the GPT-layout keys and shapes
    of a model of that config (built on the meta device: no memory), and as many blocks as n_layer.
    Otherwise a ConfigError naming the path, the key and both shapes, before any model is built.
    Every block type has GPT's layout."""
    _, spec = checkpoint_model(checkpoint)
    weights = clean_state_dict(checkpoint["model"])
    shown = ", ".join(f"{k}={spec[k]}" for k in ("n_layer", "n_embd", "n_head", "vocab_size", "block_size",
                                                 "bias"))
    where = f"checkpoint {path} contradicts itself: its model_args ({shown})"
    blocks = {int(m[1]) for k in weights for m in [re.match(r"transformer\.h\.(\d+)\.", k)] if m}
    if len(blocks) != spec["n_layer"]:
        raise ConfigError(f"{where} say n_layer={spec['n_layer']} but its weights hold {len(blocks)} blocks "
                          f"(transformer.h.*); refusing to load it")
    try:
        with torch.device("meta"):
            expected = GPT(GPTConfig(**{k: spec[k] for k in NANOGPT_ARGS})).state_dict()
    # sizes no GPT has, e.g. n_embd % n_head
    except (TypeError, ValueError, RuntimeError, AssertionError) as e:
        raise ConfigError(f"{where} describe no GPT ({type(e).__name__}: {e})") from None
    for key, want in expected.items():
        have = weights.get(key)
        if not torch.is_tensor(have):
            raise ConfigError(f"{where} need {key} of shape {tuple(want.shape)}, which its weights lack; "
                              f"refusing to load it")
        if have.shape != want.shape:
            raise ConfigError(f"{where} need {key} of shape {tuple(want.shape)}, its weights have "
                              f"{tuple(have.shape)}; refusing to load it")
    broken = next((k for k, v in weights.items() if torch.is_tensor(v) and v.is_floating_point()
                   and not torch.isfinite(v).all()), None)
    if broken is not None:  # train.py never saves a non-finite model: this one was made or damaged elsewhere
        raise ConfigError(f"checkpoint {path}: its weight {broken} holds NaN or inf values; refusing to load "
                          "it")
    extra = sorted(set(weights) - set(expected))
    if extra:
        raise ConfigError(f"{where} have no place for {extra[0]} of its weights"
                          f"{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}; refusing to load it")


def clean_state_dict(state_dict):
    """Drop the prefix torch.compile adds, and the causal-mask buffers of nanoGPT's non-flash attention
    (attn.bias), so checkpoints load into plain models."""
    return {k.removeprefix("_orig_mod."): v for k, v in state_dict.items() if not k.endswith(".attn.bias")}
