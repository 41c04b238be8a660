"""The sweeps: the table of ways (what they train and the cost model prices), their plans as
data, running them (resumable), result files, their provenance, paired comparisons, the sweeps'
own plots, and the GPU sweeps."""
