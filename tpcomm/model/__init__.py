"""The model's options and their one validator, the block types (their facts, torch-free, and their code), and the
model interface every script uses (GPT and DistributedGPT alike)."""
