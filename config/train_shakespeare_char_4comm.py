# 4 forward all-reduces per forward pass: parallel, parallel, SPD repeated.
from sweep_shakespeare_char import *  # config/sweep_shakespeare_char.py: the sweep's shared settings

out_dir = 'out-shakespeare-char-4comm'
block_types = ['parallel', 'parallel', 'spd'] * 4
