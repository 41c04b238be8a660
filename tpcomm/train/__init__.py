"""A training run: its configuration and checks, device and precision, data batches, the model it builds,
checkpoints (full and sharded), metrics and output paths."""
