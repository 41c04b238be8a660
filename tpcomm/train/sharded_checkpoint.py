"""
Sharded checkpoints (train.py --checkpoint_format=sharded), for models too large to gather on one rank:
written with torch.distributed.checkpoint (DCP), every rank writing the shards it holds, nothing
gathered. Converted to the single GPT-layout ckpt.pt (what sample.py, export_hf.py and a full-format
resume read) on one process:
$ python -m tpcomm.train.sharded_checkpoint OUT_DIR        # OUT_DIR/ckpt_sharded -> OUT_DIR/ckpt.pt

Layout on disk: OUT_DIR/ckpt_sharded is a symlink to OUT_DIR/ckpt_sharded.<iter>/, swapped atomically
(os.replace of a new link) once a save is complete, so a crash mid-save leaves the previous checkpoint in
place. The directory holds DCP's files and meta.pt (plain data: what ckpt.pt holds besides the tensors, and
the layout). Each tensor is saved as this rank's tensor-parallel part, whatever data parallelism holds of it:
  model/NAME                   a parameter every tp rank holds whole (or any parameter when tp is simulated)
  model/NAME/tpRofT            tp rank R's part of a real-TP-sharded parameter (sharding.py's rules)
  optim/NAME/KEY[/tpRofT]      its AdamW state (exp_avg, exp_avg_sq; step)
Under FSDP these are DTensors over the dp mesh (DCP writes each rank's dp shard, and one copy of what tp ranks
share); under DDP plain tensors (DCP writes one copy). So a sharded checkpoint resumes at any dp and with DDP
or FSDP, but only with the tp layout (tp_size, real or simulated, loss_parallel) and block_size that wrote it;
for any other, convert it to ckpt.pt (GPT layout, exact: the parts are only moved) and resume from that.
"""

import contextlib
import os
import pickle
import shutil
import sys
import warnings

import torch
import torch.distributed as dist

from tpcomm.errors import ConfigError
from tpcomm.configuration import exit_on_config_error
from tpcomm.tp.sharding import padded_vocab, shard_rule

SHARDED_NAME = "ckpt_sharded"
META_NAME = "meta.pt"


def layout_of(raw_model):
    """What fixes the keys and shapes of a sharded checkpoint: tp_size, whether tp is real, loss_parallel."""
    c = raw_model.config
    group = raw_model.group
    return dict(tp_size=getattr(c, "tp_size", 1), tp_real=bool(group is not None and group.real),
                loss_parallel=bool(getattr(raw_model, "vocab_parallel", False)), block_size=c.block_size)


def _tp_suffix(raw_model, name):
    """'/tpRofT' for a parameter this rank holds a real-TP part of, '' for one it
    holds whole (or simulated)."""
    group, sharding = raw_model.group, raw_model.sharding
    if group is None or not group.real or not sharding.is_sharded(name):
        return ""
    return f"/tp{group.first_shard}of{raw_model.config.tp_size}"


def unique_params(raw_model):
    """[(name, parameter)] once per tensor (the tied wte/lm_head once), and {alias: name} for the ties."""
    seen, params, aliases = {}, [], {}
    for name, p in raw_model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            aliases[name] = seen[id(p)]
        else:
            seen[id(p)] = name
            params.append((name, p))
    return params, aliases


def resharded(raw_model):
    """raw_model with its parameters registered as the sharded DTensors the optimizer holds: FSDP2 leaves the
    root module's parameters gathered (unsharded) after a forward without backward, e.g. evaluation."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(raw_model, FSDPModule):
        raw_model.reshard()
    return raw_model


def dcp_state(raw_model, optimizer):
    """The flat state dict DCP saves or loads in place: parameters and AdamW
    state, detached (same storage)."""
    params, _ = unique_params(resharded(raw_model))
    state = {f"model/{name}{_tp_suffix(raw_model, name)}": p.detach() for name, p in params}
    for name, p in params:
        for key, value in optimizer.state.get(p, {}).items():
            if torch.is_tensor(value):
                state[f"optim/{name}/{key}{_tp_suffix(raw_model, name) if value.dim() else ''}"] = value
    return state


def init_optimizer_state(raw_model, optimizer):
    """AdamW's state allocated (zeros) as its step would allocate it, so DCP can load into it in place."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p not in optimizer.state or not optimizer.state[p]:
                # AdamW keeps step on the device then
                on_device = group.get("fused") or group.get("capturable")
                step_device = getattr(p, "device", None) if on_device else None
                optimizer.state[p] = {"step": torch.zeros((), dtype=torch.float32, device=step_device),
                                      "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                      "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}


def sharded_path(out_dir):
    return os.path.join(out_dir, SHARDED_NAME)


def has_sharded(out_dir):
    """Whether out_dir holds a sharded checkpoint, whole or not (load_sharded_meta tells a corrupt one)."""
    return os.path.lexists(sharded_path(out_dir))


def remove_sharded(out_dir):
    """Remove out_dir's sharded checkpoint: the ckpt_sharded link and every ckpt_sharded.<iter> folder."""
    link = sharded_path(out_dir)
    if os.path.islink(link) or os.path.isfile(link):
        os.remove(link)
    elif os.path.isdir(link):
        shutil.rmtree(link)
    for name in os.listdir(out_dir) if os.path.isdir(out_dir) else ():
        if name.startswith(f"{SHARDED_NAME}.") and name.removeprefix(f"{SHARDED_NAME}.").isdigit():
            shutil.rmtree(os.path.join(out_dir, name), ignore_errors=True)


def save_sharded(raw_model, optimizer, meta, out_dir, pd):
    """Every rank writes its shards into ckpt_sharded.<iter>/ (DCP, a collective); the master adds meta.pt and
    then points the ckpt_sharded link at it (atomic), and removes the older directories. `meta` is the
    checkpoint dict of common.make_checkpoint without model and optimizer tensors."""
    params, aliases = unique_params(resharded(raw_model))
    names = [n for n, _ in params]
    meta = dict(meta, layout=layout_of(raw_model), param_names=raw_model._param_names(optimizer),
                aliases=aliases, state_keys=list(raw_model.state_dict().keys()), unique_names=names,
                param_groups=optimizer.state_dict()["param_groups"])
    target = f"{SHARDED_NAME}.{meta['iter_num']}"
    path = os.path.join(out_dir, target)
    if pd.is_master and os.path.lexists(path):
        shutil.rmtree(path)  # a save of this iteration that did not complete
    if pd.distributed:
        dist.barrier()
    import torch.distributed.checkpoint as dcp

    dcp.save(dcp_state(raw_model, optimizer), checkpoint_id=path, no_dist=not pd.distributed)
    if pd.is_master:
        torch.save(meta, os.path.join(path, META_NAME))
        link, tmp = sharded_path(out_dir), sharded_path(out_dir) + f".{os.getpid()}.link"
        old = os.path.realpath(link) if os.path.islink(link) else None
        os.symlink(target, tmp)
        os.replace(tmp, link)  # the switch: before it the old checkpoint is whole, after it the new one
        if old is not None and os.path.basename(old) != target:
            shutil.rmtree(old, ignore_errors=True)
    if pd.distributed:
        dist.barrier()


META_KEYS = ("model_args", "iter_num", "best_val_loss", "layout", "param_names", "aliases", "state_keys",
             "unique_names", "param_groups")  # what save_sharded's meta.pt holds and loading reads


def corrupt(out_dir, why):
    return ConfigError(f"the sharded checkpoint {sharded_path(out_dir)} is corrupt or incomplete: {why}; "
                       "resume " f"from another checkpoint, or start afresh")


def load_sharded_meta(out_dir):
    """meta.pt of OUT_DIR/ckpt_sharded (weights_only), once the folder is checked whole: meta.pt readable,
    DCP's .metadata readable and every file it points into long enough. A ConfigError naming the folder
    otherwise: none there, or a corrupt or incomplete one."""
    from tpcomm.train.checkpoint import check_fields, check_type_options, checkpoint_model

    folder = sharded_path(out_dir)
    if not os.path.lexists(folder):
        raise ConfigError(f"no sharded checkpoint at {folder} (out_dir={out_dir!r})")
    if not os.path.isdir(folder):
        raise corrupt(out_dir, "a link to nothing" if os.path.islink(folder) else "not a folder")
    path = os.path.join(folder, META_NAME)
    if not os.path.isfile(path):
        raise corrupt(out_dir, f"no {META_NAME}")
    try:
        meta = torch.load(path, map_location="cpu", weights_only=True)
        missing = [k for k in META_KEYS if k not in meta]
        if missing:
            raise KeyError(f"no {missing[0]!r}")
        model_type, spec = checkpoint_model(meta)
    except Exception as e:  # truncated zip, junk bytes, a foreign file: torch reports these with many types
        raise corrupt(out_dir, f"{META_NAME} does not load ({type(e).__name__})") from None
    check_type_options(model_type, spec, path)
    check_fields(meta, path, need=("iter_num", "best_val_loss"))
    check_dcp_files(out_dir)
    return meta


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's .metadata, building only what such a file holds: DCP's metadata classes, torch's Size,
    dtypes, layouts and memory formats, paths. torch's own reader unpickles the file unrestricted, so a
    planted `__reduce__` would run there: this one reads it first, and refuses any other global."""

    METADATA = "torch.distributed.checkpoint.metadata"  # its classes (dataclasses and enums), any of them
    NAMES = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
             ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"), ("collections", "OrderedDict"),
             ("torch.distributed.checkpoint.filesystem", "_StorageInfo")}

    def find_class(self, module, name):
        # nothing is imported or looked up before the allow-list says yes
        if (module, name) in self.NAMES:
            return super().find_class(module, name)
        if module in (self.METADATA, "torch") and not name.startswith("__"):
            found = super().find_class(module, name)
            if (module == self.METADATA and isinstance(found, type)) or isinstance(
                    found, (torch.dtype, torch.layout, torch.memory_format)):
                return found
        raise pickle.UnpicklingError(f"{module}.{name} is not something DCP metadata holds")


def read_dcp_metadata(folder):
    """DCP's Metadata of a sharded checkpoint folder, read by _MetadataUnpickler (no
    code from the file runs)."""
    with open(os.path.join(folder, ".metadata"), "rb") as f:
        return _MetadataUnpickler(f).load()


def check_dcp_files(out_dir):
    """DCP's .metadata loads (holding nothing but metadata), and each .distcp file holds the bytes it says (a
    truncated or missing file is found here, before any process group starts; junk of the right length only
    when the tensors are read)."""
    folder = sharded_path(out_dir)
    try:
        md = read_dcp_metadata(folder)
    except pickle.UnpicklingError as e:
        if "is not something" in str(e):
            raise corrupt(out_dir, f"DCP's .metadata refused, nothing of it run: {e}") from None
        raise corrupt(out_dir, "DCP's .metadata does not load (UnpicklingError)") from None
    except Exception as e:  # no .metadata, or junk: reported with many types
        raise corrupt(out_dir, f"DCP's .metadata does not load ({type(e).__name__})") from None
    try:
        ends = {}
        for info in md.storage_data.values():
            ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    except Exception as e:  # a Metadata of other shapes
        raise corrupt(out_dir, f"DCP's .metadata does not load ({type(e).__name__})") from None
    for name, end in sorted(ends.items()):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise corrupt(out_dir, f"{name} is missing")
        if os.path.getsize(path) < end:
            raise corrupt(out_dir, f"{name} is truncated ({os.path.getsize(path)} of at least {end} bytes)")


def dcp_load(state, out_dir, *, no_dist):
    """dcp.load into `state` in place; a file that does not read (junk where tensors
    should be) is a ConfigError."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: the ranks' failures

    check_dcp_files(out_dir)  # its .metadata read safely first: torch's reader unpickles it unrestricted
    try:
        # "torch.distributed is ... uninitialized, assuming ... a single process"
        with warnings.catch_warnings():
            if no_dist:
                warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, checkpoint_id=sharded_path(out_dir), no_dist=no_dist)
    except (Exception, CheckpointException) as e:
        failures = [exc for exc, _ in e.failures.values()] if isinstance(e, CheckpointException) else [e]
        raise corrupt(out_dir, f"its tensors do not read ({type((failures or [e])[0]).__name__})") from None


def check_resumable(theirs, ours, out_dir):
    """A sharded checkpoint's layout (`theirs`, layout_of) must be this run's (`ours`); otherwise a
    ConfigError telling how to go on."""
    if theirs != ours:
        diff = ", ".join(f"{k}={theirs[k]} (this run: {ours.get(k)})" for k in theirs
                         if theirs[k] != ours.get(k))
        raise ConfigError(f"the sharded checkpoint in {out_dir!r} was written with {diff}; resume with its "
                          "layout, " f"or convert it (python -m tpcomm.train.sharded_checkpoint {out_dir}) "
                          "and resume with " f"checkpoint_format='full'")


def load_sharded(raw_model, optimizer, out_dir, pd):
    """Load the weights and AdamW state in place, each rank reading what it holds (any dp, DDP or FSDP)."""
    init_optimizer_state(raw_model, optimizer)
    with torch.no_grad():
        dcp_load(dcp_state(raw_model, optimizer), out_dir, no_dist=not pd.distributed)


# ---------- conversion to the GPT-layout ckpt.pt, on one process ----------

def assemble(name, parts, layout, n_embd, vocab_size):
    """The GPT-layout tensor from the tp parts of one parameter (or moment) in tp-rank order: sharding.py's
    gather, offline."""
    tp = layout["tp_size"]
    vocab = layout["loss_parallel"] and name in ("transformer.wte.weight", "lm_head.weight")
    if vocab:  # rows by vocabulary id, padded to a multiple of tp
        full = torch.cat(parts)
        assert full.size(0) == padded_vocab(vocab_size, tp), (name, full.shape)
        return full[:vocab_size]
    if len(parts) == 1:
        return parts[0]
    view, dim, param_dim = shard_rule(name)
    local_view = list(view(n_embd, tp))
    local_view[dim] = 1
    shape = list(parts[0].shape)
    shape[param_dim] *= tp
    return torch.cat([p.reshape(local_view) for p in parts], dim=dim).reshape(shape)


def read_sharded(out_dir):
    """(meta, {key: full tensor}) of a sharded checkpoint, read on one process (no process group)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = load_sharded_meta(out_dir)
    md = read_dcp_metadata(sharded_path(out_dir))
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in md.state_dict_metadata.items()
             if isinstance(m, TensorStorageMetadata)}
    dcp_load(state, out_dir, no_dist=True)
    return meta, state


def to_full_checkpoint(meta, state):
    """The ckpt.pt dict (common.make_checkpoint's format) from a sharded checkpoint's meta and tensors."""
    layout, n_embd, vocab = meta["layout"], meta["model_args"]["n_embd"], meta["model_args"]["vocab_size"]
    T = layout["tp_size"]

    def whole(key, name):  # key: model/NAME or optim/NAME/KEY, whole or in tp parts
        parts = [state[key]] if key in state else [state[f"{key}/tp{r}of{T}"] for r in range(T)]
        return assemble(name, parts, layout, n_embd, vocab)

    model = {name: whole(f"model/{name}", name) for name in meta["unique_names"]}
    for alias, name in meta["aliases"].items():
        model[alias] = model[name]
    model = {k: model[k] for k in meta["state_keys"]}  # state_dict's keys, in its order
    opt_state = {}
    for i, name in enumerate(meta["param_names"]):
        keys = sorted({k.split("/")[2] for k in state if k.startswith(f"optim/{name}/")})
        if keys:
            opt_state[i] = {key: whole(f"optim/{name}/{key}", name) if key != "step"
                            else state[f"optim/{name}/step"] for key in keys}
    skip = ("layout", "param_names", "aliases", "state_keys", "unique_names", "param_groups")
    checkpoint = {k: v for k, v in meta.items() if k not in skip}
    checkpoint.update(model=model, optimizer={"state": opt_state, "param_groups": meta["param_groups"]})
    return checkpoint


def convert(out_dir):
    """OUT_DIR/ckpt_sharded -> OUT_DIR/ckpt.pt (atomic), GPT layout."""
    from tpcomm.train.checkpoint import save_checkpoint

    meta, state = read_sharded(out_dir)
    try:
        checkpoint = to_full_checkpoint(meta, state)
    # meta.pt and the tensors disagree
    except (KeyError, IndexError, ValueError, RuntimeError, AssertionError) as e:
        raise corrupt(out_dir, f"{META_NAME} does not match its tensors ({type(e).__name__}: {e})") from None
    save_checkpoint(checkpoint, out_dir)
    return os.path.join(out_dir, "ckpt.pt")


@exit_on_config_error
def main(argv):
    if len(argv) != 1 or argv[0].startswith("-"):
        raise ConfigError("usage: python -m tpcomm.train.sharded_checkpoint OUT_DIR (converts "
                          "OUT_DIR/ckpt_sharded to OUT_DIR/ckpt.pt)")
    with contextlib.redirect_stdout(sys.stderr):
        path = convert(argv[0])
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
