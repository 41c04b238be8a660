# 12 forward all-reduces per forward pass: all SPD blocks.
from sweep_shakespeare_char import *  # config/sweep_shakespeare_char.py: the sweep's shared settings

out_dir = 'out-shakespeare-char-12comm'
block_types = ['spd'] * 12
