# 6 forward all-reduces per forward pass: alternating parallel, SPD.
from sweep_shakespeare_char import *  # config/sweep_shakespeare_char.py: the sweep's shared settings

out_dir = 'out-shakespeare-char-6comm'
block_types = ['parallel', 'spd'] * 6
