# `make test` is the README's test command; `make setup` installs what it needs.
PY ?= python

.PHONY: setup test
setup:
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0 || $(PY) -m pip install -q "torch>=2.4"
	$(PY) -m pip install -q -r requirements.txt

test: setup
	OMP_NUM_THREADS=2 $(PY) -m pytest -q tests test_20k_experiment.py
