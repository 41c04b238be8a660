"""The other parallel dimensions around tensor parallelism: the pp x dp x tp process layout, data parallelism
(DDP, FSDP2) and pipeline parallelism."""
