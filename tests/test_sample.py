"""sample.py reads checkpoints of either model type (DistributedGPT rebuilt with its own block pattern)."""

import pytest

from conftest import TINY, run_script


@pytest.mark.parametrize("model", [[], ["--model_type=distributed_gpt", "--tp_size=2",
                                        "--block_types=['spd','parallel']"]], ids=["gpt", "distributed_gpt"])
def test_sample_from_a_checkpoint(char_data, tmp_path, model):
    out = str(tmp_path / "run")
    r = run_script("train.py", *TINY, "--dataset=chars", f"--data_dir={char_data}", f"--out_dir={out}",
                   "--max_iters=10", "--eval_interval=10", *model)
    assert r.returncode == 0, r.stderr
    r = run_script("sample.py", f"--out_dir={out}", "--device=cpu", "--num_samples=2", "--max_new_tokens=30",
                   "--start=def ")
    assert r.returncode == 0, r.stderr
    samples = r.stdout.split("loading ")[-1].split("\n", 1)[1].split("---------------")
    assert len(samples) == 3 and all(s.strip().startswith("def") for s in samples[:2]), r.stdout
    assert len(samples[0].strip()) >= 30


def test_sample_bad_input(tmp_path):
    r = run_script("sample.py", f"--out_dir={tmp_path}", "--device=cpu")
    assert r.returncode == 2 and "no checkpoint" in r.stderr and "Traceback" not in r.stderr
    r = run_script("sample.py", "--init_from=gpt3", "--device=cpu")
    assert r.returncode == 2 and "init_from" in r.stderr and len(r.stderr.strip().splitlines()) == 1
