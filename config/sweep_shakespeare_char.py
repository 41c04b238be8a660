# The CPU-sized Shakespeare-char communication sweep: settings shared by every
# config/train_shakespeare_char_*comm.py, which each start with `from sweep_shakespeare_char import *`
# and set only out_dir and block_types. One token budget for all of them; tensor parallel size 4.
# On its own this is the all-TP baseline (24 forward all-reduces), like train_shakespeare_char_24comm.py:
# $ python train.py config/train_shakespeare_char_24comm.py
out_dir = 'out-shakespeare-char-sweep'
dataset = 'shakespeare_char'
model_type = 'distributed_gpt'
tp_size = 4
block_types = ['tp'] * 12

n_layer = 12
n_head = 4
n_embd = 64
dropout = 0.0
block_size = 64
batch_size = 12
gradient_accumulation_steps = 1
max_iters = 500
lr_decay_iters = 500
warmup_iters = 50
learning_rate = 2e-3
min_lr = 2e-4
beta2 = 0.99
seed = 1337

eval_interval = 100
eval_iters = 32
log_interval = 10
always_save_checkpoint = False
compile = False
