# 24 forward all-reduces per forward pass: all Megatron TP blocks (baseline).
from sweep_shakespeare_char import *  # config/sweep_shakespeare_char.py: the sweep's shared settings

out_dir = 'out-shakespeare-char-24comm'
block_types = ['tp'] * 12
