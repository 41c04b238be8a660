# evaluate the base gpt2-medium
# n_layer, n_head and n_embd come from the pretrained model
batch_size = 8
eval_iters = 500  # use more iterations to get good estimate
eval_only = True
wandb_log = False
init_from = 'gpt2-medium'
