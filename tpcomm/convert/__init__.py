"""Converting a trained checkpoint: Sync-Point Drop the paper's way (with head grouping), Ladder Residual's
upper-half adaptation, Hugging Face export."""
