# 1 forward all-reduce per forward pass: all parallel blocks; one sync before ln_f.
from sweep_shakespeare_char import *  # config/sweep_shakespeare_char.py: the sweep's shared settings

out_dir = 'out-shakespeare-char-1comm'
block_types = ['parallel'] * 12
