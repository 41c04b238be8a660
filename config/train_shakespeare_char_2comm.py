# 2 forward all-reduces per forward pass: five parallel then SPD, twice.
from sweep_shakespeare_char import *  # config/sweep_shakespeare_char.py: the sweep's shared settings

out_dir = 'out-shakespeare-char-2comm'
block_types = (['parallel'] * 5 + ['spd']) * 2
