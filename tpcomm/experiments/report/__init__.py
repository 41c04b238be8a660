"""`python experiment.py report`: the README's answer, the docs' tables and figures, regenerated from the
committed result files and checked."""
