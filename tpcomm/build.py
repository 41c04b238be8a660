"""
build_model: the model a run trains, from a dict of its config: model.py's GPT (as PlainGPT, with the model
interface of tpcomm/models.py) or DistributedGPT (tensor_parallel_model.py), optionally on the meta device.
"""

import contextlib

import torch

from configurator import ConfigError
from model import NANOGPT_ARGS, GPTConfig
from tensor_parallel_model import TP_COMM_OPTIONS, DistributedGPT, TPConfig
from tpcomm.models import PlainGPT

MODEL_TYPES = ("gpt", "distributed_gpt")


def build_model(model_type, model_args, *, pd=None, init_device="default"):
    """PlainGPT or DistributedGPT from a dict of GPTConfig fields (nanoGPT's 7, gelu_approximate) and, for
    distributed_gpt, tp_size, block_types, loss_parallel and the TP_COMM_OPTIONS. Extra keys are ignored, so a run's config dict works
    too. init_device='meta': built on the meta device, no memory and no weights: shard it if wanted, then
    model.materialize_(device) gives GPT's initial weights bitwise (data_parallel.parallelize does both)."""
    if init_device not in ("default", "meta"):
        raise ConfigError(f"init_device must be 'default' or 'meta', got {init_device!r}")
    meta = init_device == "meta"
    gpt_args = {k: model_args[k] for k in NANOGPT_ARGS}
    gpt_args["gelu_approximate"] = model_args.get("gelu_approximate") or "none"
    with torch.device("meta") if meta else contextlib.nullcontext():
        if model_type == "gpt":
            return PlainGPT(GPTConfig(**gpt_args))
        if model_type == "distributed_gpt":
            options = {k: model_args[k] for k in TP_COMM_OPTIONS if k in model_args}
            return DistributedGPT(TPConfig(**gpt_args, tp_size=model_args.get("tp_size", 1),
                                           block_types=model_args.get("block_types"),
                                           loss_parallel=bool(model_args.get("loss_parallel", False)), **options),
                                  pd=pd, init=not meta)
    raise ConfigError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
