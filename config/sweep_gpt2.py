# The GPT-2 communication sweep: settings shared by every config/train_gpt2_*comm.py, which each
# start with `from sweep_gpt2 import *` and set only out_dir, wandb_run_name and block_types.
# One token budget for all of them (batch, accumulation, steps, lr, seed):
# 20k steps x ~0.5M tokens ~= 9.8B tokens. GPT-2 124M on OpenWebText, tensor parallel size 2.
# On its own this is the all-TP baseline (24 forward all-reduces), like train_gpt2_24comm.py:
# $ torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_24comm.py
out_dir = 'out-gpt2-sweep'
# off unless asked for (--wandb_log=True, after `wandb login`): the sweep runs train.py as a non-interactive
# subprocess, where wandb cannot ask for a key and the run would fail at its start
wandb_log = False
wandb_project = 'owt'
wandb_run_name = 'gpt2-124M-sweep'

dataset = 'openwebtext'
model_type = 'distributed_gpt'
tp_size = 2
block_types = ['tp'] * 12

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
