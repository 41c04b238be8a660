# `make test` is the README's test command; `make setup` installs what it needs.
PY ?= python

.PHONY: setup test test-fast experiment gpu-check gpu-scale
# torch: 2.13 is the floor (requirements.txt, docs/gpu.md). An installed torch >= 2.13 is kept (on a machine with an
# NVIDIA GPU only if it is a CUDA build). Else, with a GPU (nvidia-smi works): PyPI's torch==$(TORCH), which is its
# CUDA build; without one: torch==$(TORCH)+cpu, the CPU build (PyPI's plain torch would pull the multi-GB CUDA build
# and its NVIDIA libraries), falling back to the plain wheel where no CPU build can be found.
TORCH ?= 2.13.0
TORCH_OK = import sys, torch; v = tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2]); \
	sys.exit(v < (2, 13) or (sys.argv[1] == 'gpu' and not torch.cuda.is_available()))
setup:
	@gpu=$$(nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu); \
	if $(PY) -c "$(TORCH_OK)" $$gpu 2>/dev/null; then \
	  echo "make setup: keeping torch $$($(PY) -c 'import torch; print(torch.__version__)') (2.13 is the floor: docs/gpu.md)"; \
	elif [ $$gpu = gpu ]; then \
	  echo "make setup: NVIDIA GPU found: installing torch==$(TORCH) from PyPI, its CUDA build (docs/gpu.md)"; \
	  $(PY) -m pip uninstall -y -q torch 2>/dev/null; $(PY) -m pip install -q torch==$(TORCH); \
	else \
	  echo "make setup: no NVIDIA GPU: installing torch==$(TORCH)+cpu, the CPU build (a plain torch is the multi-GB CUDA build)"; \
	  $(PY) -m pip install -q torch==$(TORCH)+cpu || $(PY) -m pip install -q torch==$(TORCH); \
	fi
	$(PY) -m pip install -q -r requirements.txt

# Both tiers run as 2 pytest-xdist workers (-n 2) of one thread each, a test file per worker at a time (--dist
# loadfile: a module's fixtures run once; handed out in tests/conftest.py's ORDER); the torchrun launches of one
# world size are shared by every test file that needs them (tests/support/run_workers.py, docs/tests.md). Plain
# `pytest FILE` runs serially.
# the full suite (CI runs it): 13 min 51 s serially on a quiet 2-core host before this layout; the goal and the
# times measured since: docs/tests.md
test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile tests test_20k_experiment.py

# the fast tier while working (tests/conftest.py FAST): 116 s serially before; goal and times: docs/tests.md
test-fast: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile -m fast tests

# The communication sweep on Shakespeare-char (16 configs, one token budget), two runs at a time of one thread
# each, trained into experiments/local/cpu/ (not committed; a rerun skips its finished runs): results.md (.csv,
# .json), three PNG plots and a result file per run, to set beside the committed ones (experiments/cpu/runs/,
# docs/experiments.md). 500 steps are early training; the long runs are in docs/axes.md. Its time: README.md.
experiment: setup
	test -f data/shakespeare_char/train.bin -a -f data/shakespeare_char/val.bin || $(PY) data/shakespeare_char/prepare.py
	OMP_NUM_THREADS=1 $(PY) experiment.py cpu --out=experiments/local/cpu --jobs=2

# One CUDA GPU, ~6 min (at most 8): GPT-2 124M step, MFU and compile, simulated tp 8, decode, real TP on the one GPU,
# the bf16 identity and comm-time checks, into docs/gpu.json and docs/gpu.md's generated section (docs/gpu.md).
# Its CPU rehearsal: python -m tpcomm.gpu.gpu_check --sizes=tiny --device=cpu --out_dir=/tmp. It needs torch only, so a
# GPU machine without network runs it as it is (`make setup` only when torch is missing).
gpu-check:
	$(PY) -c "import torch" 2>/dev/null || $(MAKE) setup
	$(PY) -m tpcomm.gpu.gpu_check --out_dir=docs

# One chunk of the gpu-scale sweep on one GPU (docs/gpu.md, "gpu-scale"): the next runs that fit $(MINUTES) minutes,
# each leaving experiments/gpu-scale/runs/<run>-seed<S>.json; it unpacks data/linux/linux-char.tar.xz when the
# .bin files are missing. `python experiment.py gpu-scale --dry-run` prints the plan and its GPU-minutes.
MINUTES ?= 8
gpu-scale:
	$(PY) experiment.py gpu-scale --budget-minutes=$(MINUTES)
