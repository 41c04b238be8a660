"""FSDP2 over dp against one process (tests/fsdp_worker.py under torchrun, gloo): GPT and simulated-TP
DistributedGPT at dp 2, and real TP at dp 2 x tp 2; 3 AdamW steps with clipping and gradient accumulation;
meta-device init under FSDP."""

import json

import pytest

from conftest import shared_launch

# tests/fsdp_worker.py in the shared launches of 2 and 4 processes (conftest.shared_launch)
SHARED_LAUNCHES = {"results": {(nproc, tp): (nproc, ["tests/fsdp_worker.py", f"--tp={tp}", "{dir}/results.json"])
                               for nproc, tp in ((2, 1), (4, 2))}}


@pytest.fixture(scope="module", params=[(2, 1), (4, 2)], ids=["dp2", "dp2xtp2"])
def results(request):
    with open(shared_launch(request, SHARED_LAUNCHES) / "results.json") as f:
        return json.load(f)


def test_fsdp_equals_one_process(results):
    kinds = ["gpt", "distributed_gpt"] if results["tp"] == 1 else ["distributed_gpt"]
    for kind in kinds:
        r = results["results"][f"fsdp/{kind}"]
        assert r["ratio"] <= 1.0, json.dumps(r)
        assert r["losses"]["values"][0][-1] != r["losses"]["values"][0][0]  # it trained
        assert results["results"][f"can_fail/fsdp/{kind}"]["ratio"] > 10  # a changed shard is seen


def test_meta_init_under_fsdp_is_gpts_init(results):
    assert results["results"]["fsdp/meta_init_exact"]["ok"]
    assert results["results"]["fsdp/meta_init_holds_its_shard"]["ok"]
