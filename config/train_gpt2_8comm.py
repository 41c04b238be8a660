# 8 forward all-reduces per forward pass: parallel, SPD, SPD repeated.
from sweep_gpt2 import *  # config/sweep_gpt2.py: the sweep's shared settings

out_dir = 'out-gpt2-8comm'
wandb_run_name = 'gpt2-124M-8comm'
block_types = ['parallel', 'spd', 'spd'] * 4
