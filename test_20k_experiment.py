"""
The experiment configs are what their names say. Runs under pytest on CPU (about a minute):
$ python -m pytest -q test_20k_experiment.py

- every experiment config loads through train.py's configurator;
- each *comm.py config is its sweep's base (config/sweep_gpt2.py, config/sweep_shakespeare_char.py) plus only
  out_dir, wandb_run_name and block_types;
- the train_gpt2_*comm.py configs build ~124M-parameter DistributedGPTs (within 1% of GPT's count) whose
  forward pass works on a tiny batch, and all of them share one token budget;
- the forward all-reduces measured by instrumenting f/g equal the number in each config's name.
"""

import glob
import os
import re

import pytest
import torch

from tpcomm.train.build import build_model
from tpcomm.train.train_config import defaults
from tpcomm.configuration import configure
from model import GPT, GPTConfig
from tpcomm.model.options import validate_tp_args

ROOT = os.path.dirname(os.path.abspath(__file__))
GPT2_COMM = sorted(glob.glob(os.path.join(ROOT, "config", "train_gpt2_*comm.py")))
CHAR_COMM = sorted(glob.glob(os.path.join(ROOT, "config", "train_shakespeare_char_*comm.py")))
ALL = sorted(glob.glob(os.path.join(ROOT, "config", "*.py")))
BUDGET_KEYS = ("batch_size", "block_size", "gradient_accumulation_steps", "max_iters", "lr_decay_iters",
               "warmup_iters", "learning_rate", "min_lr", "seed", "n_layer", "n_head", "n_embd", "tp_size")


def load(path):
    return configure(defaults(), [path])


def model_args(cfg, vocab_size):
    keys = ("n_layer", "n_head", "n_embd", "block_size", "bias", "dropout", "tp_size", "block_types")
    return dict({k: cfg[k] for k in keys}, vocab_size=vocab_size)


def comm_in_name(path):
    return int(re.search(r"_(\d+)comm\.py$", path).group(1))


def test_the_sweep_configs_exist():
    assert sorted(comm_in_name(p) for p in GPT2_COMM) == [6, 8, 12, 16, 18, 24]
    assert {24, 18, 16, 12, 8, 6} <= {comm_in_name(p) for p in CHAR_COMM}


@pytest.mark.parametrize("path", ALL, ids=os.path.basename)
def test_every_config_loads(path):
    cfg = load(path)
    if cfg["model_type"] == "distributed_gpt":  # raises ConfigError on a bad pattern
        validate_tp_args(**{k: cfg[k] for k in ("n_layer", "n_head", "n_embd", "tp_size", "block_types")})


@pytest.mark.parametrize("group", [GPT2_COMM, CHAR_COMM], ids=["gpt2", "shakespeare_char"])
def test_one_token_budget(group):
    budgets = {p: tuple(load(p)[k] for k in BUDGET_KEYS) for p in group}
    assert len(set(budgets.values())) == 1, budgets


@pytest.mark.parametrize("group, base", [(GPT2_COMM, "sweep_gpt2.py"),
                                         (CHAR_COMM, "sweep_shakespeare_char.py")],
                         ids=["gpt2", "shakespeare_char"])
def test_comm_configs_are_their_base_plus_name_and_block_types(group, base):
    base_cfg = load(os.path.join(ROOT, "config", base))
    for path in group:
        cfg = load(path)
        differ = {k for k in cfg if cfg[k] != base_cfg[k]}
        assert differ <= {"out_dir", "wandb_run_name", "block_types"}, (path, differ)
        assert cfg["out_dir"] != base_cfg["out_dir"], path  # no two runs write to one place


@pytest.fixture(scope="module")
def gpt2_params():
    with torch.device("meta"):  # the parameter count needs no weights
        return GPT(GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304,
                             bias=False)).get_num_params()


@pytest.mark.parametrize("path", GPT2_COMM, ids=os.path.basename)
def test_gpt2_config_builds_124m_and_measures_its_name(path, gpt2_params):
    """The config's model is GPT-2 124M (built on the meta device: the count needs no weights), and a
    forward pass of its blocks makes the all-reduces its name says: the same pattern and layer count at a
    width of 4 per head, since the count depends on the blocks, not on their width
    (test_char_config_measures_its_name: the whole model)."""
    cfg = load(path)
    with torch.device("meta"):
        n = build_model(cfg["model_type"], model_args(cfg, 50304)).get_num_params()
    assert abs(n - gpt2_params) / gpt2_params < 0.01 and 123e6 < n < 125e6, n
    torch.manual_seed(0)
    model = build_model(cfg["model_type"], dict(model_args(cfg, 50304), n_embd=4 * cfg["n_head"]))
    idx = torch.randint(50304, (1, 8))
    logits, _ = model(idx)
    assert logits.shape == (1, 1, 50304) and torch.isfinite(logits).all()
    assert model.comm_per_forward(idx)["fwd_allreduces"] == comm_in_name(path)


@pytest.mark.parametrize("path", CHAR_COMM, ids=os.path.basename)
def test_char_config_measures_its_name(path):
    cfg = load(path)
    model = build_model(cfg["model_type"], model_args(cfg, 65))
    report = model.comm_per_forward(torch.randint(65, (2, 16)))
    assert report["fwd_allreduces"] == comm_in_name(path)
