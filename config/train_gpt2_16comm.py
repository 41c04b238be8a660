# GPT-2 124M on OpenWebText, 16 forward all-reduces per forward pass: TP, SPD, SPD repeated.
# All train_gpt2_*comm.py configs share one token budget (batch, accumulation, steps, lr, seed);
# only block_types differs. 20k steps x ~0.5M tokens ~= 9.8B tokens.
# $ torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_16comm.py
out_dir = 'out-gpt2-16comm'
wandb_log = True
wandb_project = 'owt'
wandb_run_name = 'gpt2-124M-16comm'

dataset = 'openwebtext'
model_type = 'distributed_gpt'
tp_size = 2
block_types = ['tp', 'spd', 'spd'] * 4

batch_size = 12
block_size = 1024
gradient_accumulation_steps = 5 * 8
max_iters = 20000
lr_decay_iters = 20000
warmup_iters = 2000
learning_rate = 6e-4
min_lr = 6e-5
weight_decay = 1e-1
seed = 1337

eval_interval = 1000
eval_iters = 200
log_interval = 10
