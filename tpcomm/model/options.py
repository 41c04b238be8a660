"""
The model's options and their one validator. Every place options enter (train.py, bench.py, sample.py, the
sweeps, the converters spd.py and tpcomm/convert/ladder_conversion.py) checks them here, through
`model_config` (a run's config dict) or TPConfig (DistributedGPT's config, which runs the same checks): a rule
such as "n_embd divisible by n_head" or "tp_overlap needs tp_size > 1" is written once. A refusal is a
ConfigError naming keys and values.
"""

import itertools
from dataclasses import dataclass, fields
from typing import Optional

from tpcomm.errors import ConfigError
from model import GELU_FORMS, GPTConfig
from tpcomm.tp.compress.compression import validate_compression
from tpcomm.model.block_types.registry import (BLOCK_TYPES, block_type, option_defaults, option_fields,
                                               quoted, type_options)

MODEL_TYPES = ("gpt", "distributed_gpt")
# The TPConfig keys that set how syncs move (build_model and train.py pass them through as they are)
TP_COMM_OPTIONS = ("tp_overlap", "tp_async_grad", "sequence_parallel", "tp_comm_dtype", "tp_comm_block",
                   "tp_comm_exchange", "tp_collective_matmul")
# the sync options that change the model's function (lossy compression of g's partial sums), not only its
# schedule
FUNCTION_SYNC_OPTIONS = ("tp_comm_dtype", "tp_comm_block", "tp_comm_exchange")
# what makes a DistributedGPT out of a GPT: given to model_type='gpt', each one is refused
# (and the block types' own options: registry.option_fields, e.g. caat_sync_fraction)
TP_KEYS = ("tp_size", "block_types", "loss_parallel", *TP_COMM_OPTIONS)


def block_types_with(fact, block_types=None):
    """The block types (of block_types, else of every registered one) whose class has `fact`
    (tpcomm/model/block_types/), in order, each once: block_types_with('overlaps') == ['tp', 'spd']."""
    kinds = BLOCK_TYPES if block_types is None else dict.fromkeys(block_types)
    return [k for k in kinds if getattr(block_type(k), fact)]


def private_head(block_types, tp_size):
    """Whether the head reads each shard's own stream (no final sync): the last block's type says so (its
    private_head fact: 'caat'), at tp_size >= 2 (at 1 the one stream is GPT's, and so is the head)."""
    return tp_size > 1 and block_type(block_types[-1]).private_head


def expand_block_types(block_types, n_layer):
    """block_types as one entry per layer: None means all 'tp', one name means that type for every layer."""
    kinds = "tp" if block_types is None else block_types
    return [kinds] * n_layer if isinstance(kinds, str) else list(kinds)


def validate_tp_args(*, n_layer, n_head, n_embd, tp_size, block_types):
    """Raise ConfigError naming the key and values for any impossible combination."""
    if not isinstance(tp_size, int) or tp_size < 1:
        raise ConfigError(f"tp_size must be a positive int, got {tp_size!r}")
    if n_head % tp_size:
        raise ConfigError(f"n_head ({n_head}) must be divisible by tp_size ({tp_size})")
    check_heads(n_embd=n_embd, n_head=n_head)
    if block_types is None:
        return
    if isinstance(block_types, str):  # one type for every layer: 'spd' means ['spd'] * n_layer
        if block_types not in BLOCK_TYPES:
            raise ConfigError(f"block_types: unknown block type {block_types!r}; use {list(BLOCK_TYPES)}")
        return
    if not isinstance(block_types, (list, tuple)):
        raise ConfigError(f"block_types must be a list of {tuple(BLOCK_TYPES)}, got {block_types!r}")
    if len(block_types) != n_layer:
        raise ConfigError(f"block_types has {len(block_types)} entries but n_layer is {n_layer}")
    bad = sorted({str(b) for b in block_types if not isinstance(b, str) or b not in BLOCK_TYPES})
    if bad:
        raise ConfigError(f"block_types: unknown block type(s) {bad}; use {list(BLOCK_TYPES)}")


def check_heads(*, n_embd, n_head):
    if n_embd % n_head:
        raise ConfigError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")


def validate_sync_options(*, tp_overlap, sequence_parallel, block_types, tp_size=None, tp_async_grad=False,
                          tp_collective_matmul=False):
    """tp_overlap, tp_async_grad and sequence_parallel (docs/overlap.md): ConfigError naming the keys and
    values. block_types is the expanded list. The batch-size conditions are checked where the batch is known
    (check_batch, the forward)."""
    if isinstance(tp_overlap, bool) or not isinstance(tp_overlap, int) or tp_overlap < 1:
        raise ConfigError(f"tp_overlap must be a positive int (chunks of the batch), got {tp_overlap!r}")
    if not isinstance(sequence_parallel, bool):
        raise ConfigError(f"sequence_parallel must be True or False, got {sequence_parallel!r}")
    if not isinstance(tp_async_grad, bool):
        raise ConfigError(f"tp_async_grad must be True or False, got {tp_async_grad!r}")
    if tp_size == 1 and (tp_overlap > 1 or sequence_parallel or tp_async_grad):  # one shard: no sync to move
        key = (f"tp_overlap={tp_overlap}" if tp_overlap > 1 else
               "sequence_parallel=True" if sequence_parallel else "tp_async_grad=True")
        raise ConfigError(f"{key} needs tp_size > 1, got tp_size=1: one shard runs no all-reduce")
    if tp_async_grad and not block_types_with("fuses_f", block_types):
        raise ConfigError(f"tp_async_grad=True has nothing to make asynchronous: it fuses f in "
                          f"{quoted(block_types_with('fuses_f'))} blocks, and block_types={block_types} has "
                          "none")
    if tp_async_grad and sequence_parallel:
        raise ConfigError("tp_async_grad=True does not run with sequence_parallel=True (its backward "
                          "collectives are reduce-scatters and all-gathers, not f's all-reduce; "
                          "docs/overlap.md): use one of them")
    if tp_overlap > 1 and not block_types_with("overlaps", block_types):
        chunked, delayed = quoted(block_types_with("overlaps")), quoted(block_types_with("delays"))
        raise ConfigError(f"tp_overlap={tp_overlap} has nothing to overlap: it chunks {chunked} blocks, and "
                          f"block_types={block_types} has none (a {delayed} block overlaps by itself)")
    if sequence_parallel and tp_overlap > 1:
        raise ConfigError(f"sequence_parallel=True does not run with tp_overlap={tp_overlap} (the chunks' "
                          f"reduce-scatters and all-gathers are not asynchronous; docs/overlap.md): use "
                          "one of them")
    no_sp = [k for k in dict.fromkeys(block_types) if not block_type(k).sequence_parallel]
    if sequence_parallel and no_sp:
        raise ConfigError(f"sequence_parallel=True does not run with {quoted(no_sp)} blocks (block_types="
                          f"{block_types}): their syncs are not token-sharded (docs/overlap.md)")
    validate_collective_matmul(tp_collective_matmul=tp_collective_matmul, sequence_parallel=sequence_parallel,
                               block_types=block_types)


def validate_collective_matmul(*, tp_collective_matmul, sequence_parallel, block_types):
    """tp_collective_matmul (tpcomm/tp/collective_matmul.py): sequence parallelism's all-gather + column GEMM
    and row GEMM + reduce-scatter as rings of peer-to-peer steps, so it needs sequence_parallel=True and only
    block types whose syncs are those pairs (collective_matmul: 'tp')."""
    if not isinstance(tp_collective_matmul, bool):
        raise ConfigError(f"tp_collective_matmul must be True or False, got {tp_collective_matmul!r}")
    if tp_collective_matmul and not sequence_parallel:
        raise ConfigError("tp_collective_matmul=True needs sequence_parallel=True (it decomposes sequence "
                          "parallelism's all-gathers and reduce-scatters), got sequence_parallel=False")
    if tp_collective_matmul and block_types_with("collective_matmul",
                                                 block_types) != list(dict.fromkeys(block_types)):
        rings = quoted(block_types_with("collective_matmul"))
        raise ConfigError(f"tp_collective_matmul=True runs {rings} blocks only, got "
                          f"block_types={block_types}")


def validate_compressible(*, tp_comm_dtype, block_types):
    """tp_comm_dtype against block types that are not compressible: ConfigError naming the key and value."""
    whole_rows = [k for k in dict.fromkeys(block_types) if not block_type(k).compressible]
    if tp_comm_dtype and whole_rows:
        raise ConfigError(f"tp_comm_dtype={tp_comm_dtype!r} does not run with {quoted(whole_rows)} blocks "
                          f"(block_types={block_types}): their syncs move a channel slice, not blocks")


def check_compression_block(*, tp_comm_dtype, tp_comm_block, n_embd):
    """tp_comm_block where nothing reads it: refused rather than ignored
    (tpcomm/tp/compress/compression.py checks the rest)."""
    if tp_comm_dtype == "bf16" and isinstance(tp_comm_block,
                                              int) and tp_comm_block >= 1 and n_embd % tp_comm_block:
        raise ConfigError(f"tp_comm_block={tp_comm_block} has no effect with tp_comm_dtype='bf16' (bf16 "
                          "moves no " f"scales, so no blocks): leave tp_comm_block at "
                          f"{TPConfig.tp_comm_block}")


@dataclass
class TPConfig(GPTConfig):
    tp_size: int = 1
    block_types: Optional[list] = None  # one block type (tpcomm/model/block_types.BLOCK_TYPES) per layer, or
    # one for all layers; None = all 'tp' the block types' own options by config key (registry.option_fields:
    # caat_sync_fraction); missing: defaults
    block_options: Optional[dict] = None
    # shard the tied wte/lm_head by vocabulary and compute the loss from the sharded logits (vocab-parallel
    # cross-entropy), never gathering a token's full vocabulary of logits on one rank
    loss_parallel: bool = False
    # how the blocks' syncs move (docs/overlap.md, docs/compression.md): none of them changes the weights
    # K > 1: a tp/spd block's batch in K chunks, each chunk's all-reduce overlapping the next
    tp_overlap: int = 1
    # f's backward all-reduce issued asynchronously, waited for after the weight gradient
    tp_async_grad: bool = False
    # Megatron SP: the synced stream sharded along the tokens between tp blocks
    sequence_parallel: bool = False
    # compress every g reduction's partial sums (block-quantized); None: off
    tp_comm_dtype: Optional[str] = None
    tp_comm_block: int = 32  # values per absmax scale along the hidden dimension (tp_comm_dtype)
    # how they move: 'one_shot' all-gather, 'two_shot' reduce-scatter + all-gather
    tp_comm_exchange: str = "one_shot"
    tp_collective_matmul: bool = False  # sequence parallelism's collectives as rings beside partial GEMMs

    def __post_init__(self):
        validate_tp_args(n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd, tp_size=self.tp_size,
                         block_types=self.block_types)
        self.block_types = expand_block_types(self.block_types, self.n_layer)
        validate_sync_options(tp_overlap=self.tp_overlap, sequence_parallel=self.sequence_parallel,
                              block_types=self.block_types, tp_size=self.tp_size,
                              tp_async_grad=self.tp_async_grad,
                              tp_collective_matmul=self.tp_collective_matmul)
        # {kind: its Options}, one per type of the model, each checked
        self.type_options = type_options(self.block_options or {}, self.block_types, n_embd=self.n_embd,
                                         tp_size=self.tp_size)
        validate_compressible(tp_comm_dtype=self.tp_comm_dtype, block_types=self.block_types)
        check_compression_block(tp_comm_dtype=self.tp_comm_dtype, tp_comm_block=self.tp_comm_block,
                                n_embd=self.n_embd)
        validate_compression(tp_comm_dtype=self.tp_comm_dtype, tp_comm_block=self.tp_comm_block,
                             n_embd=self.n_embd, tp_size=self.tp_size,
                             sequence_parallel=self.sequence_parallel, tp_comm_exchange=self.tp_comm_exchange)


def tp_config(**kw):
    """TPConfig of keyword arguments that may hold the block types' options by their config keys
    (caat_sync_fraction=0.25), which go to its block_options."""
    own = {**(kw.pop("block_options", None) or {}), **{k: kw.pop(k) for k in list(kw)
                                                       if k in option_fields()}}
    return TPConfig(**kw, block_options=own)


TP_DEFAULTS = {f.name: f.default for f in fields(TPConfig) if f.name in TP_KEYS}


def model_config(model_type, args, *, tp_mode="simulated"):
    """The checked config of a model: GPTConfig (model_type 'gpt') or TPConfig ('distributed_gpt') from a dict
    holding its keys (a run's whole config works: other keys are ignored; missing ones take their defaults). A
    'gpt' given a TP key (or tp_mode='real') is refused, naming it."""
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
    if args.get("gelu_approximate", "none") not in GELU_FORMS:
        raise ConfigError(f"gelu_approximate must be one of {GELU_FORMS}, got {args['gelu_approximate']!r}")
    gpt = {f.name: args[f.name] for f in fields(GPTConfig) if args.get(f.name) is not None}
    if model_type == "distributed_gpt":
        tp = {k: args[k] for k in TP_KEYS if k in args}
        block = tp.get("tp_comm_block", TP_DEFAULTS["tp_comm_block"])
        # a run's option, ignored
        if tp.get("tp_comm_dtype") is None and block != TP_DEFAULTS["tp_comm_block"]:
            raise ConfigError(f"tp_comm_block={block!r} has no effect with tp_comm_dtype=None (no "
                              "compression): set " f"tp_comm_dtype too, or leave tp_comm_block at "
                              f"{TP_DEFAULTS['tp_comm_block']}")
        if tp.get("tp_comm_dtype") == "bf16" and block != TP_DEFAULTS["tp_comm_block"]:  # likewise
            raise ConfigError(f"tp_comm_block={block!r} has no effect with tp_comm_dtype='bf16' (bf16 moves "
                              "no " f"scales, so no blocks): leave tp_comm_block at "
                              f"{TP_DEFAULTS['tp_comm_block']}")
        # the block types' options (caat_sync_fraction)
        own = {k: args[k] for k in option_fields() if k in args}
        return tp_config(**gpt, **dict(tp, loss_parallel=bool(tp.get("loss_parallel", False))), **own)
    check_heads(n_embd=gpt.get("n_embd", GPTConfig.n_embd), n_head=gpt.get("n_head", GPTConfig.n_head))
    if tp_mode != "simulated" or args.get("tp_size", 1) != 1 or args.get("block_types") is not None:
        raise ConfigError(f"tp_size/block_types/tp_mode need model_type='distributed_gpt', "
                          f"got model_type={model_type!r}, tp_size={args.get('tp_size', 1)}, "
                          f"block_types={args.get('block_types')}, tp_mode={tp_mode!r}")
    if args.get("loss_parallel"):
        raise ConfigError(f"loss_parallel=True needs model_type='distributed_gpt' (it shards wte/lm_head "
                          "over the " f"tensor-parallel shards), got model_type={model_type!r}")
    defaults = {**TP_DEFAULTS, **option_defaults()}
    changed = {k: args[k] for k in (*TP_COMM_OPTIONS, *option_fields()) if k in args
               and args[k] != defaults[k]}
    if changed:
        raise ConfigError(f"{', '.join(f'{k}={v!r}' for k, v in changed.items())} needs "
                          f"model_type='distributed_gpt', got model_type={model_type!r}")
    return GPTConfig(**gpt)


def gpt_args(args):
    """args without the TP keys and the block types' options: the same sizes as a plain GPT (bench.py's
    comparison)."""
    return {k: v for k, v in args.items() if k not in TP_KEYS and k not in option_fields()}


def check_batch(config, *, batch_size, block_size):
    """The sync options against the batch a run uses: tp_overlap chunks whole sequences, sequence parallelism
    splits the tokens over the shards."""
    if not isinstance(config, TPConfig):
        return
    if batch_size % config.tp_overlap:
        raise ConfigError(f"tp_overlap ({config.tp_overlap}) must divide batch_size ({batch_size}): each "
                          f"chunk is whole sequences")
    if config.sequence_parallel and batch_size * block_size % config.tp_size:
        raise ConfigError(f"sequence_parallel=True needs batch_size x block_size ({batch_size} x "
                          f"{block_size}) divisible by tp_size ({config.tp_size})")


def compact_list(items):
    """The shortest obvious Python expression for a list: ['tp']*12, ['parallel','spd','spd']*4,
    (['parallel']*5+['spd'])*2. It evaluates back to the list (and train.py accepts it as --block_types)."""
    items, n = list(items), len(items)
    period = next(p for p in range(1, n + 1) if n % p == 0 and items[:p] * (n // p) == items)
    unit, reps = items[:period], n // period
    runs = [(k, len(list(g))) for k, g in itertools.groupby(unit)]
    if len(runs) > 1 and any(c >= 3 for _, c in runs):
        expr = "+".join(f"['{k}']*{c}" if c > 1 else f"['{k}']" for k, c in runs)
        expr = f"({expr})" if reps > 1 else expr
    else:
        expr = "[" + ",".join(f"'{k}'" for k in unit) + "]"
    return expr if reps == 1 else f"{expr}*{reps}"
