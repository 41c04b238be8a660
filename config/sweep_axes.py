# The axes sweeps' model (experiment.py cpu-long, tp-axis, size-axis, convergence; docs/axes.md): the cpu
# sweep's 12 x 64 model with 8 heads (so tp_size 8 divides them), trained 10x longer than `cpu`, evaluated
# every 250 steps on 50 batches, checkpointed at every eval so an interrupted run resumes. The sweeps set
# block_types, tp_size and, for the size and convergence axes, the size and the steps on the command line. On
# its own: all-'tp' at tp 4.
# $ python train.py config/sweep_axes.py --block_types="['spd']*12"
out_dir = 'out-axes'
dataset = 'shakespeare_char'
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
compile = False
