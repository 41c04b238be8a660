"""Every documented train.py launch (README.md, docs/*.md, train.py's docstring) passes train.py's checks at
the world size it states: torchrun's --nnodes x --nproc_per_node processes (1 for plain python). Nothing is
launched: train.prepare runs as rank 0 of that world would run it (RANK/WORLD_SIZE set), with the data files
and GPT-2's weights, which these machines lack, stubbed out. The commands are found by
tests/house/test_docs.py's extractor."""

import os

import pytest

from test_docs import DOC_FILES, ROOT, extract_commands


def torchrun_world(words):
    """Processes of a launch: --nnodes x --nproc_per_node for torchrun (given as
    --opt=value), 1 for python."""
    if words[0] != "torchrun" and "torch.distributed.run" not in words:
        return 1
    opts = dict(w[2:].split("=", 1) for w in words if w.startswith("--") and "=" in w)
    return int(opts.get("nnodes", 1)) * int(opts.get("nproc_per_node", 1))


def documented_launches():
    import train

    sources = {doc: open(os.path.join(ROOT, doc)).read() for doc in DOC_FILES}
    sources["train.py"] = f"```\n{train.__doc__}\n```"  # its $ lines, as a code block
    for doc, text in sources.items():
        for lineno, _, words in extract_commands(text):
            script = next((i for i, w in enumerate(words) if os.path.basename(w) == "train.py"), None)
            if script is None:
                continue
            yield pytest.param(torchrun_world(words[:script]), words[script + 1:], id=f"{doc}:{lineno}")


LAUNCHES = list(documented_launches())


def test_the_launches_are_found():
    worlds = {p.id: p.values[0] for p in LAUNCHES}
    assert len(LAUNCHES) >= 15, worlds
    # the 2-node GPT-2 recipe
    assert 16 in {w for at, w in worlds.items() if at.startswith("docs/training.md:")}
    assert 32 in worlds.values()  # docs/pipeline.md's 4 nodes


@pytest.mark.parametrize("world, args", LAUNCHES)
def test_documented_launch_validates_at_its_world_size(world, args, monkeypatch, tmp_path):
    from tpcomm.train import train_config as train  # train.py's prepare, and what it calls

    if any(a.startswith("--init_from=resume") for a in args):
        pytest.skip("resumes a checkpoint the docs' earlier command writes")
    monkeypatch.chdir(tmp_path)  # out_dir: no earlier run's checkpoint in the way
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    if world > 1:
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("LOCAL_RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setattr(train, "check_data", lambda *a, **k: None)  # OpenWebText is not on this machine
    monkeypatch.setattr(train, "load_pretrained", lambda *a, **k: {})  # nor GPT-2's weights
    argv = [os.path.join(ROOT, a) if a.endswith(".py") and not a.startswith("--") else a for a in args]
    cfg, setup = train.prepare(argv)  # a ConfigError here is what the user would get, rank by rank
    assert setup.pp * setup.dp * setup.tp == world


def test_the_check_sees_a_refused_launch(monkeypatch, tmp_path):
    """Anti-vacuity: the 2-node recipe with the accumulation nanoGPT's config had
    (40 over dp 16) is refused."""
    from tpcomm.train import train_config as train
    from tpcomm.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setattr(train, "check_data", lambda *a, **k: None)
    with pytest.raises(ConfigError, match=r"gradient_accumulation_steps \(40\) must be divisible .* \(16\)"):
        train.prepare([os.path.join(ROOT, "config/train_gpt2.py"), "--gradient_accumulation_steps=40"])
