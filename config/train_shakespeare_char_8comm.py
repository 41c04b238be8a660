# 8 forward all-reduces per forward pass: parallel, SPD, SPD repeated.
from sweep_shakespeare_char import *  # config/sweep_shakespeare_char.py: the sweep's shared settings

out_dir = 'out-shakespeare-char-8comm'
block_types = ['parallel', 'spd', 'spd'] * 4
