"""Tensor parallelism itself: Megatron's f and g, their asynchronous, sequence-parallel and
collective-matmul forms, the shard-side layers, keyed dropout, the vocabulary-parallel loss,
partial-channel sync and the collective counter."""
