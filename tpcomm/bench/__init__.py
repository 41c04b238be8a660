"""Measuring on this machine: bench.py's options, op profiles, collective traces, the pipeline
benchmark, compression error."""
