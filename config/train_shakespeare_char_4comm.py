# CPU-sized Shakespeare-char version of the communication sweep, 4 forward all-reduces: parallel, parallel, SPD repeated.
# All train_shakespeare_char_*comm.py configs share one token budget; only block_types differs.
# $ python train.py config/train_shakespeare_char_4comm.py
out_dir = 'out-shakespeare-char-4comm'
dataset = 'shakespeare_char'
model_type = 'distributed_gpt'
tp_size = 4
block_types = ['parallel', 'parallel', 'spd'] * 4

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
