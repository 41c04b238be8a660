# 18 forward all-reduces per forward pass: alternating TP, SPD.
from sweep_gpt2 import *  # config/sweep_gpt2.py: the sweep's shared settings

out_dir = 'out-gpt2-18comm'
wandb_run_name = 'gpt2-124M-18comm'
block_types = ['tp', 'spd'] * 6
