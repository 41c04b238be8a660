# nanoGPT's CPU recipe for Shakespeare-char as a config: a 4x128 baby GPT, ~40 ms/step on 2 cores.
# $ python data/shakespeare_char/prepare.py && python train.py config/train_shakespeare_char_cpu.py
# For DistributedGPT add e.g. --model_type=distributed_gpt --tp_size=2 --block_types="['spd']*4".
out_dir = 'out-shakespeare-char'
dataset = 'shakespeare_char'
device = 'cpu'
compile = False
dtype = 'float32'

n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0
block_size = 64
batch_size = 12
gradient_accumulation_steps = 1
max_iters = 2000
lr_decay_iters = 2000
warmup_iters = 100
learning_rate = 1e-3
min_lr = 1e-4
beta2 = 0.99

eval_interval = 250
eval_iters = 20
log_interval = 50  # a line every ~2 s
always_save_checkpoint = False
