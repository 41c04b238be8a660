# The gpu-scale sweep's model (python experiment.py gpu-scale; docs/gpu.md "gpu-scale"): the axes model of
# config/sweep_axes.py (12 x 64, 8 heads, tp 4, 5000 steps, an eval every 250 on 50 batches, a checkpoint at
# every eval so a run cut off by the end of a GPU window resumes) on the Linux kernel's C source
# (data/linux/prepare.py), bf16 autocast and torch.compile on a CUDA GPU (dtype 'auto'). The sweep sets each
# size's layers, width, batch and learning rate, and the block pattern, on the command line
# (tpcomm/experiments/sweep_plan.py, SCALE_SIZES).
# $ python train.py config/gpu_scale.py --block_types="['spd']*12"
out_dir = 'out-gpu-scale'
dataset = 'linux'
model_type = 'distributed_gpt'
tp_size = 4
block_types = ['tp'] * 12

n_layer = 12
n_head = 8
n_embd = 64
dropout = 0.0
block_size = 64
batch_size = 12
gradient_accumulation_steps = 1
max_iters = 5000
lr_decay_iters = 5000
warmup_iters = 50
learning_rate = 2e-3
min_lr = 2e-4
beta2 = 0.99
seed = 1337

eval_interval = 250
eval_iters = 50
log_interval = 10
always_save_checkpoint = True
compile = True
dtype = 'auto'
