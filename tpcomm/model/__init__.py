"""The model's options and their one validator, the block types (one module each, torch-free, in
block_types/), what their forwards run on (blocks.py), and the model interface every script uses
(GPT and DistributedGPT alike)."""
