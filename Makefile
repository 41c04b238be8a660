# `make test` is the README's test command; `make setup` installs what it needs.
PY ?= python

.PHONY: setup test test-fast experiment
setup:
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0 || $(PY) -m pip install -q "torch>=2.4"
	$(PY) -m pip install -q -r requirements.txt

# Both tiers run as 2 pytest-xdist workers (-n 2) of one thread each, a test file per worker at a time (--dist
# loadfile: a module's fixtures run once); the torchrun launches of one world size are shared by every test file
# that needs them (tests/run_workers.py, docs/tests.md). Plain `pytest FILE` runs serially.
# the full suite (CI runs it): 13 min 51 s serially on a quiet 2-core host before this layout; the goal and the
# times measured since: docs/tests.md
test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile tests test_20k_experiment.py

# the fast tier while working (tests/conftest.py FAST): 116 s serially before; goal and times: docs/tests.md
test-fast: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile -m fast tests

# The communication sweep on Shakespeare-char (16 configs, one token budget): ~7.5 min on 2 CPU cores, trained
# here into experiments/local/cpu/ (not committed; a rerun skips its finished runs): results.md (.csv, .json), three
# PNG plots and a result file per run, to set beside the committed ones (experiments/cpu/runs/, docs/experiments.md;
# `python experiment.py cpu` trains into those). 500 steps are early training (fewer syncs give a lower loss
# there); the long runs are in docs/axes.md.
experiment: setup
	test -f data/shakespeare_char/train.bin -a -f data/shakespeare_char/val.bin || $(PY) data/shakespeare_char/prepare.py
	$(PY) experiment.py cpu --out=experiments/local/cpu
