"""
The block-type registry, torch-free: each type is one class holding its facts (what its syncs are, whether it
leaves the stream desynced or its outputs pending, which execution strategies it runs under), its options and
its forward. The validator (tpcomm/model/options.py), config parsing, checkpoints, the cost model, the
pipeline's cuts and the reports read a type through here, never by its name.

A type's forward runs on a tpcomm/model/blocks.ShardedBlock (the sharded attention and MLP, the
masks, f and g), which DistributedGPT mixes in when it builds the block (blocks.block_class); so a
type's module needs no torch, and the cost model, which imports no torch, reads the same class. A
new type is one class and one `register` call.
"""

import dataclasses
from dataclasses import dataclass

from tpcomm.errors import ConfigError


@dataclass(frozen=True)
class NoOptions:
    """A type without options of its own."""

    def check(self, *, n_embd, tp_size):
        """ConfigError naming the key and value for an impossible option (tp_size, n_embd: the model's)."""


class BlockType:
    """The facts every block type declares (class attributes), with their defaults. Options: a frozen
    dataclass of the type's own options, each field `f` the config key `<kind>_<f>` (caat's
    sync_fraction: caat_sync_fraction)."""
    kind = None  # its name in block_types (register sets it)
    # g's all-reduces in its forward (on the whole stream; 'caat': each of a fraction of it)
    forward_syncs = 0
    backward_syncs = (0, 0)  # f's all-reduces in its backward: (its input synced, its input desynced)
    desyncs = False  # leaves the stream desynced (r_i differ): a later sync, or the final one, sums the d_i
    delays = False  # leaves its reduced outputs pending, added by the next block (they cross a pipeline cut)
    overlaps = False  # tp_overlap chunks its batch, each chunk's all-reduce behind the next chunk's compute
    # runs under sequence_parallel (its syncs become reduce-scatters and all-gathers)
    sequence_parallel = True
    collective_matmul = False  # runs under tp_collective_matmul (its syncs are SP's all-gather/GEMM pairs)
    compressible = True  # runs under tp_comm_dtype (its syncs move whole rows of partial sums)
    fuses_f = True  # runs f fused with the LayerNorm and projection after it under tp_async_grad
    gpt_at_tp1 = True  # at tp_size 1 it is GPT's block
    tp_dependent = False  # its function changes with tp_size (at tp >= 2 another model than at tp 1)
    # as the last block: no final sync, each shard's ln_f and vocabulary slice read its stream
    private_head = False
    # a type written as `equations`: its first module reads LN1 of the synced stream through f
    norm_before_f = True
    #                       ('tp'), rather than each shard's LN1 of the stream f fanned out ('spd')
    Options = NoOptions

    @staticmethod
    def synced_share(options):
        """The share of the channels each of its syncs moves (its bytes against a full sync's)."""
        return 1.0


# The block types: the names block_types accepts, each with its class
BLOCK_TYPES = {}


def register(kind, cls):
    """Enter cls (a BlockType) as the block type `kind`: block_types accepts it, DistributedGPT builds it, its
    options are config keys, and every place reads its facts."""
    if not (isinstance(cls, type) and issubclass(cls, BlockType)):
        raise TypeError(f"block type {kind!r}: {cls!r} is not a BlockType")
    if not (dataclasses.is_dataclass(cls.Options) and cls.Options.__dataclass_params__.frozen):
        raise TypeError(f"block type {kind!r}: its Options {cls.Options!r} is not a frozen dataclass")
    cls.kind = kind
    BLOCK_TYPES[kind] = cls
    return cls


def block_type(kind):
    """The class of block type `kind`; ValueError naming the registered types for any other name."""
    try:
        return BLOCK_TYPES[kind]
    except (KeyError, TypeError):
        raise ValueError(f"unknown block type {kind!r}; the registered types are "
                         f"{list(BLOCK_TYPES)}") from None


def option_fields():
    """{config key: (block type, its Options field)} over every registered type:
    caat_sync_fraction -> ('caat', ...)."""
    return {f"{kind}_{f.name}": (kind, f) for kind, cls in BLOCK_TYPES.items()
            for f in dataclasses.fields(cls.Options)}


def option_defaults():
    """{config key: default} of every registered type's options."""
    return {key: f.default for key, (_, f) in option_fields().items()}


def quoted(kinds):
    """Block type names for a message: 'tp' and 'spd'."""
    q = [f"'{k}'" for k in kinds]
    return " and ".join([", ".join(q[:-1]), q[-1]] if len(q) > 1 else q)


def type_options(values, block_types, *, n_embd, tp_size):
    """{kind: its Options} for each type in block_types (the expanded list) from values, a dict holding config
    keys (missing ones take their defaults), each checked. A key of a type the model has none of, set to other
    than its default, is refused: it would do nothing."""
    kinds, chosen = dict.fromkeys(block_types), {}
    for key, (kind, f) in option_fields().items():
        if key in values and kind not in kinds and values[key] != f.default:
            raise ConfigError(f"{key}={values[key]!r} has no effect without '{kind}' blocks (block_types="
                              f"{list(block_types)}): leave it at {f.default!r}")
        chosen.setdefault(kind, {})[f.name] = values.get(key, f.default)
    options = {kind: block_type(kind).Options(**chosen.get(kind, {})) for kind in kinds}
    for kind, opts in options.items():
        opts.check(n_embd=n_embd, tp_size=tp_size)
    return options


def option_values(options):
    """The config keys of {kind: Options} (type_options' result), for a checkpoint or a result file."""
    return {f"{kind}_{f.name}": getattr(opts, f.name) for kind, opts in options.items()
            for f in dataclasses.fields(opts)}


def synced_share(values, block_types, *, n_embd, tp_size):
    """The smallest share of the channels a sync of these block types moves under the options in values
    (config keys; a key of a type not among them is ignored): p for 'caat', 1 for a full sync."""
    kinds = dict.fromkeys(block_types)
    given = {k: v for k, v in values.items() if k in option_fields() and option_fields()[k][0] in kinds}
    options = type_options(given, kinds, n_embd=n_embd, tp_size=tp_size)
    return min(block_type(k).synced_share(o) for k, o in options.items())
