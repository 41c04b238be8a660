# GPT-2 124M on OpenWebText as a DistributedGPT with Megatron TP blocks (simulated unless --tp_mode=real)
# $ torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_distributed.py
out_dir = 'out-gpt2-distributed'
wandb_log = True
wandb_project = 'owt'
wandb_run_name = 'gpt2-124M-distributed'

model_type = 'distributed_gpt'
tp_size = 2
block_types = ['tp'] * 12

batch_size = 12
block_size = 1024
gradient_accumulation_steps = 5 * 8
max_iters = 600000
lr_decay_iters = 600000

eval_interval = 1000
eval_iters = 200
log_interval = 10
weight_decay = 1e-1
