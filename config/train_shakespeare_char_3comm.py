# 3 forward all-reduces per forward pass: three parallel then SPD, repeated.
from sweep_shakespeare_char import *  # config/sweep_shakespeare_char.py: the sweep's shared settings

out_dir = 'out-shakespeare-char-3comm'
block_types = ['parallel', 'parallel', 'parallel', 'spd'] * 3
