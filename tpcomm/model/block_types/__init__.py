"""
The block types, one module each (its facts, options, checks and forward): Megatron tensor-parallel ('tp', 2
forward all-reduces), Sync-Point Drop ('spd', 1), fully 'parallel' (0), Ladder Residual ('ladder', 2, delayed)
and partial-channel sync ('caat', 2 of a fraction of the channels). Importing the package registers them, in
this order, into registry.BLOCK_TYPES.
"""

from tpcomm.model.block_types import tp, spd, parallel, ladder, caat  # noqa: F401 (each registers its type)
