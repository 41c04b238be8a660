# 18 forward all-reduces per forward pass: alternating TP, SPD.
from sweep_shakespeare_char import *  # config/sweep_shakespeare_char.py: the sweep's shared settings

out_dir = 'out-shakespeare-char-18comm'
block_types = ['tp', 'spd'] * 6
