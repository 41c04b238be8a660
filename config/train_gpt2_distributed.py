# GPT-2 124M on OpenWebText as in train_gpt2.py, as a DistributedGPT with Megatron TP blocks, tp_size 2
# (all-'tp' computes GPT exactly; simulated unless --tp_mode=real)
# $ torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_distributed.py --tp_mode=real
from train_gpt2 import *  # config/train_gpt2.py: nanoGPT's settings

out_dir = 'out-gpt2-distributed'
wandb_run_name = 'gpt2-124M-distributed'
model_type = 'distributed_gpt'
tp_size = 2
block_types = ['tp'] * 12
