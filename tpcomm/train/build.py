"""
build_model: the model a run trains, from a dict of its config: model.py's GPT (as PlainGPT, with
the model interface of tpcomm/model/interface.py) or DistributedGPT (tensor_parallel_model.py),
optionally on the meta device.
"""

import contextlib

import torch

from tpcomm.errors import ConfigError
from tensor_parallel_model import DistributedGPT
from tpcomm.parallel.data_parallel import INIT_DEVICES
from tpcomm.model.interface import PlainGPT
from tpcomm.model.options import TPConfig, gpt_args, model_config


def build_model(model_type, model_args, *, pd=None, init_device="default"):
    """PlainGPT or DistributedGPT from a dict of GPTConfig fields (nanoGPT's 7, gelu_approximate) and, for
    distributed_gpt, tp_size, block_types, loss_parallel and the TP_COMM_OPTIONS, checked by
    options.model_config. Extra keys are ignored (for 'gpt' the TP keys too: the same sizes as a plain GPT),
    so a run's config dict works too; a run's options are checked, TP keys of a 'gpt' refused, where they
    enter (train_config.check_model)."""
    if model_type == "gpt":
        model_args = gpt_args(model_args)
    return model_from_config(model_config(model_type, model_args), pd=pd, init_device=init_device)


def model_from_config(config, *, pd=None, init_device="default"):
    """The model of a checked config (options.model_config): DistributedGPT for a TPConfig, else PlainGPT.
    init_device='meta': built on the meta device, no memory and no weights: shard it if wanted, then
    model.materialize_(device) gives GPT's initial weights bitwise (data_parallel.parallelize does both)."""
    if init_device not in INIT_DEVICES:
        raise ConfigError(f"init_device must be one of {INIT_DEVICES}, got {init_device!r}")
    meta = init_device == "meta"
    with torch.device("meta") if meta else contextlib.nullcontext():
        if isinstance(config, TPConfig):
            return DistributedGPT(config, pd=pd, init=not meta)
        return PlainGPT(config)
