# `make test` is the README's test command; `make setup` installs what it needs.
PY ?= python

.PHONY: setup test test-fast experiment gpu-check
setup:
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0 || $(PY) -m pip install -q "torch>=2.4"
	$(PY) -m pip install -q -r requirements.txt

# the full suite (CI runs it): ~14 min on 2 CPU cores
test: setup
	OMP_NUM_THREADS=2 $(PY) -m pytest -q tests test_20k_experiment.py

# the fast tier while working (tests/conftest.py FAST): a few minutes on 2 CPU cores
test-fast: setup
	OMP_NUM_THREADS=2 $(PY) -m pytest -q -m fast tests

# The communication sweep on Shakespeare-char (16 configs, one token budget): ~7.5 min on 2 CPU cores, trained
# here into experiments/local/cpu/ (not committed; a rerun skips its finished runs): results.md (.csv, .json), three
# PNG plots and a result file per run, to set beside the committed ones (experiments/cpu/runs/, docs/experiments.md;
# `python experiment.py cpu` trains into those). 500 steps are early training (fewer syncs give a lower loss
# there); the long runs are in docs/axes.md.
experiment: setup
	test -f data/shakespeare_char/train.bin -a -f data/shakespeare_char/val.bin || $(PY) data/shakespeare_char/prepare.py
	$(PY) experiment.py cpu --out=experiments/local/cpu

# One CUDA GPU, ~6 min (at most 8): GPT-2 124M step, MFU and compile, simulated tp 8, decode, real TP on the one GPU,
# the bf16 identity and comm-time checks, into docs/gpu.json and docs/gpu.md's generated section (docs/gpu.md).
# Its CPU rehearsal: python -m tpcomm.gpu_check --sizes=tiny --device=cpu --out_dir=/tmp
gpu-check: setup
	$(PY) -m tpcomm.gpu_check --out_dir=docs
