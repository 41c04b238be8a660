"""
Export a checkpoint to a Hugging Face GPT2LMHeadModel folder (save_pretrained format), with no network:
$ python export_hf.py --out_dir=out-shakespeare-char --hf_dir=out-shakespeare-char/hf
then transformers.GPT2LMHeadModel.from_pretrained("out-shakespeare-char/hf").

Any checkpoint of GPT form exports: model_type 'gpt', or 'distributed_gpt' whose blocks are all 'tp'
(Megatron tensor parallelism computes GPT exactly). Sync-Point-Drop and parallel blocks compute something
else than GPT-2's block, so their checkpoints are refused. A model without biases (bias=False) exports
with zero biases, which is the same function; the GELU form maps to HF's activation_function ('none' ->
'gelu', 'tanh' -> 'gelu_new').
"""

import os
import sys

import torch

from tpcomm.train.checkpoint import checkpoint_model, clean_state_dict, load_checkpoint
from tpcomm.errors import ConfigError
from tpcomm.configuration import configure, exit_on_config_error

DEFAULTS = dict(
    out_dir="out",  # the run whose ckpt.pt is exported
    hf_dir=None,  # the folder to write; None: <out_dir>/hf
    # True: write into an hf_dir that already holds files (its config.json, model.safetensors)
    overwrite=False,
)

HF_ACTIVATION = {"none": "gelu", "tanh": "gelu_new"}  # our GELU form -> GPT2Config.activation_function
GPT2_EOT, GPT2_VOCAB = 50256, 50257  # GPT-2's <|endoftext|> id (its bos and eos), and its vocabulary size
# Hugging Face's GPT-2 uses Conv1D, whose weight is the transpose of nn.Linear's
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def exportable_spec(checkpoint):
    """The checkpoint's GPT spec, or a ConfigError saying why it is not GPT-2 architecture."""
    model_type, spec = checkpoint_model(checkpoint)
    if model_type == "distributed_gpt":
        other = sorted(set(spec["block_types"]) - {"tp"})
        if other:
            raise ConfigError(f"cannot export: block_types {spec['block_types']} include {other}, which are "
                              "not " f"GPT-2 blocks (only model_type 'gpt' or all-'tp' distributed_gpt "
                              "checkpoints are)")
    return spec


def hf_config(spec):
    from transformers import GPT2Config

    # GPT-2's BPE (vocab_size 50257, or nanoGPT's 50304 padding of it) has <|endoftext|> as bos and eos; a
    # character-level (or other) vocabulary has neither, and id 50256 would not even be a token of it
    eot = GPT2_EOT if spec["vocab_size"] >= GPT2_VOCAB else None
    return GPT2Config(vocab_size=spec["vocab_size"], n_positions=spec["block_size"], n_embd=spec["n_embd"],
                      n_layer=spec["n_layer"], n_head=spec["n_head"], n_inner=4 * spec["n_embd"],
                      activation_function=HF_ACTIVATION[spec["gelu_approximate"]], layer_norm_epsilon=1e-5,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                      bos_token_id=eot, eos_token_id=eot)


def to_hf_state_dict(state_dict, hf_keys):
    """Our GPT state dict -> GPT2LMHeadModel's: Conv1D weights transposed; the biases a bias=False model lacks
    (Linear and LayerNorm) are zeros of the shape Hugging Face expects."""
    out = {}
    for k, shape in hf_keys.items():
        if k in state_dict:
            v = state_dict[k].float()
            out[k] = v.t().contiguous() if k.endswith(CONV1D_WEIGHTS) else v
        elif k.endswith(".bias"):
            out[k] = torch.zeros(shape)
    return out


def export(checkpoint, hf_dir):
    """Write the checkpoint as a GPT2LMHeadModel folder; returns the model."""
    from transformers import GPT2LMHeadModel

    spec = exportable_spec(checkpoint)
    model = GPT2LMHeadModel(hf_config(spec))
    hf_keys = {k: v.shape for k, v in model.state_dict().items()}
    sd = to_hf_state_dict(clean_state_dict(checkpoint["model"]), hf_keys)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    # causal-mask buffers
    missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias"))]
    assert not missing and not unexpected, (missing, unexpected)
    try:
        os.makedirs(hf_dir, exist_ok=True)
        model.save_pretrained(hf_dir)
    except OSError as e:  # a full disk, a folder that went away or became read-only since check_hf_dir
        raise ConfigError(f"could not write hf_dir {hf_dir!r}: {e.strerror or type(e).__name__}") from None
    return model


def check_hf_dir(hf_dir, *, overwrite):
    """hf_dir must be a folder that can be created (or is writable) and, unless
    overwrite, holds no files yet."""
    if os.path.isdir(hf_dir):
        names = sorted(os.listdir(hf_dir))
        if names and not overwrite:
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            raise ConfigError(f"hf_dir {hf_dir!r} is not empty ({shown}); give --overwrite=True to write "
                              "over " f"its files, or another hf_dir")
        if not os.access(hf_dir, os.W_OK):
            raise ConfigError(f"hf_dir {hf_dir!r} is not writable")
        return
    if os.path.lexists(hf_dir):
        raise ConfigError(f"hf_dir {hf_dir!r} exists and is not a directory")
    parent = os.path.dirname(os.path.abspath(hf_dir))
    while not os.path.lexists(parent):  # the nearest existing folder is where makedirs starts
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ConfigError(f"hf_dir {hf_dir!r} cannot be created: {parent!r} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"hf_dir {hf_dir!r} cannot be created: {parent!r} is not writable")


@exit_on_config_error
def main(argv):
    cfg = configure(DEFAULTS, argv)
    hf_dir = cfg["hf_dir"] or os.path.join(cfg["out_dir"], "hf")
    check_hf_dir(hf_dir, overwrite=cfg["overwrite"])
    checkpoint = load_checkpoint(cfg["out_dir"])  # a config that contradicts its weights is refused there
    exportable_spec(checkpoint)  # refuse before writing anything
    export(checkpoint, hf_dir)
    print(f"exported {os.path.join(cfg['out_dir'], 'ckpt.pt')} (iter {checkpoint['iter_num']}) to {hf_dir}")


if __name__ == "__main__":
    main(sys.argv[1:])
