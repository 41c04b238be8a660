# 12 forward all-reduces per forward pass: all SPD blocks.
from sweep_gpt2 import *  # config/sweep_gpt2.py: the sweep's shared settings

out_dir = 'out-gpt2-12comm'
wandb_run_name = 'gpt2-124M-12comm'
block_types = ['spd'] * 12
