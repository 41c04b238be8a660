"""
The block types' facts, torch-free: what a type's syncs are, whether it leaves the stream desynced or its outputs
pending, which execution strategies it runs under, whether it is GPT's block at tp 1. The validator
(tpcomm/model/options.py), the cost model, the pipeline's cuts and the reports read them here, never a type's name
(the cost model's default command imports no torch, so the facts cannot live only beside the blocks' code).

Each built-in type's facts are one small class here, which its code's class in tpcomm/model/blocks.py inherits
(TPBlock(TPType, ShardedBlock)); BLOCK_TYPES maps each name to the class holding its facts: the block's own class
once blocks.py has registered it (DistributedGPT builds from it), the facts class before. A new type is one class
(its facts declared on it, or inherited) and one `blocks.register` call, which enters it here.
"""


class BlockType:
    """The facts every block type declares (class attributes), with their defaults."""
    kind = None  # its name in block_types (add sets it)
    forward_syncs = 0  # g's all-reduces in its forward (on the whole stream; 'caat': each of a fraction of it)
    backward_syncs = (0, 0)  # f's all-reduces in its backward: (its input synced, its input desynced)
    desyncs = False  # leaves the stream desynced (r_i differ): a later sync, or the final one, sums the d_i
    delays = False  # leaves its reduced outputs pending, added by the next block (they cross a pipeline cut)
    overlaps = False  # tp_overlap chunks its batch, each chunk's all-reduce behind the next chunk's compute
    sequence_parallel = True  # runs under sequence_parallel (its syncs become reduce-scatters and all-gathers)
    collective_matmul = False  # runs under tp_collective_matmul (its syncs are SP's all-gather/GEMM pairs)
    compressible = True  # runs under tp_comm_dtype (its syncs move whole rows of partial sums)
    channel_fraction = False  # its syncs move caat_sync_fraction of the channels (that option is its own)
    gpt_at_tp1 = True  # at tp_size 1 it is GPT's block
    tp_dependent = False  # its function changes with tp_size (at tp >= 2 another model than at tp 1)
    private_head = False  # as the last block: no final sync, each shard's ln_f and vocabulary slice read its stream


class TPType(BlockType):
    """'tp' (Megatron): both modules' outputs all-reduced, output synced."""
    forward_syncs, backward_syncs = 2, (2, 1)  # desynced input: only the MLP reads the synced stream through f
    overlaps = collective_matmul = True


class SPDType(BlockType):
    """'spd' (Sync-Point Drop): the attention's all-reduce dropped, output synced."""
    forward_syncs, backward_syncs = 1, (1, 0)  # backward: the fan-out of a synced input
    overlaps = tp_dependent = True


class ParallelType(BlockType):
    """'parallel': no communication, each shard on its own stream, output desynced."""
    backward_syncs = (1, 0)  # the fan-out of a synced input
    desyncs = tp_dependent = True


class LadderType(BlockType):
    """'ladder' (Ladder Residual): both all-reduces issued and left pending to the next module."""
    forward_syncs, backward_syncs = 2, (2, 0)  # desynced input: both modules read the shards' own streams
    delays = True
    sequence_parallel = False  # its pending all-reduces are not token-sharded
    gpt_at_tp1 = False  # each module reads the stream from before the previous module's output, at every tp


class CAATType(BlockType):
    """'caat' (partial-channel sync, CAAT-Net): each sync all-reduces caat_sync_fraction of the channels, the rest
    private to each shard's stream; output desynced, and read by the head shard by shard when last."""
    forward_syncs, backward_syncs = 2, (3, 2)  # each sync's fan-out (a fraction), and a synced input's (whole)
    desyncs = channel_fraction = tp_dependent = private_head = True
    sequence_parallel = compressible = False  # its streams are not token-sharded; its syncs move a channel slice
    default_fraction = 0.5  # the paper's main setting: half of each sync's channels all-reduced (50% less TP traffic)


# The block types: the names block_types accepts, each with the class holding its facts
BLOCK_TYPES = {}


def add(kind, cls):
    """Enter cls (a BlockType) as the block type `kind` (tpcomm/model/blocks.register calls it with the code)."""
    if not (isinstance(cls, type) and issubclass(cls, BlockType)):
        raise TypeError(f"block type {kind!r}: {cls!r} is not a BlockType")
    cls.kind = kind
    BLOCK_TYPES[kind] = cls
    return cls


for _kind, _cls in (("tp", TPType), ("spd", SPDType), ("parallel", ParallelType), ("ladder", LadderType),
                    ("caat", CAATType)):
    add(_kind, _cls)


def block_type(kind):
    """The class holding block type `kind`'s facts; ValueError naming the registered types for any other name."""
    try:
        return BLOCK_TYPES[kind]
    except (KeyError, TypeError):
        raise ValueError(f"unknown block type {kind!r}; the registered types are {list(BLOCK_TYPES)}") from None
