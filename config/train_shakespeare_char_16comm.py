# 16 forward all-reduces per forward pass: TP, SPD, SPD repeated.
from sweep_shakespeare_char import *  # config/sweep_shakespeare_char.py: the sweep's shared settings

out_dir = 'out-shakespeare-char-16comm'
block_types = ['tp', 'spd', 'spd'] * 4
