# 16 forward all-reduces per forward pass: TP, SPD, SPD repeated.
from sweep_gpt2 import *  # config/sweep_gpt2.py: the sweep's shared settings

out_dir = 'out-gpt2-16comm'
wandb_run_name = 'gpt2-124M-16comm'
block_types = ['tp', 'spd', 'spd'] * 4
