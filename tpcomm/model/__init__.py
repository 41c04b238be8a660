"""The model's options and their one validator, and the model interface every script uses (GPT and DistributedGPT alike)."""
