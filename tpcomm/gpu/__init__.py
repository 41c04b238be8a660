"""`make gpu-check`: what one CUDA GPU measures in a few minutes (bf16 identity, cost
calibration) and where it writes it."""
