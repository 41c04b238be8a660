# 24 forward all-reduces per forward pass: all Megatron TP blocks (baseline).
from sweep_gpt2 import *  # config/sweep_gpt2.py: the sweep's shared settings

out_dir = 'out-gpt2-24comm'
wandb_run_name = 'gpt2-124M-24comm'
block_types = ['tp'] * 12
