# 6 forward all-reduces per forward pass: alternating parallel, SPD.
from sweep_gpt2 import *  # config/sweep_gpt2.py: the sweep's shared settings

out_dir = 'out-gpt2-6comm'
wandb_run_name = 'gpt2-124M-6comm'
block_types = ['parallel', 'spd'] * 6
