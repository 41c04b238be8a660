# config for training GPT-2 (124M) down to very nice loss of ~2.85 on 1 node of 8X A100 40GB
# launch as the following (e.g. in a screen session) and wait ~5 days:
# $ torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py

wandb_log = True
wandb_project = 'owt'
wandb_run_name = 'gpt2-124M'

# these make the total batch size be ~0.5M 10 batch size * 1024 block size * 48 micro-batches = 491,520 tokens
# per step, nanoGPT's batch (its 12 x 40 micro-batches, 5 per GPU on 8 GPUs); 48 divides over 1, 2, 3, 4, 6,
# 8, 12, 16 data-parallel ranks, so the same config runs on one node of 8 GPUs (6 micro-batches each) and on
# two (3 each), where 40 would not split over 16
batch_size = 10
block_size = 1024
gradient_accumulation_steps = 6 * 8

# this makes total number of tokens be 300B
max_iters = 600000
lr_decay_iters = 600000

# eval stuff
eval_interval = 1000
eval_iters = 200
log_interval = 10

# weight decay
weight_decay = 1e-1
