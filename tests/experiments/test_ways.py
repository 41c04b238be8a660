"""The one table of ways (tpcomm/experiments/ways.py): adding a way is one entry. A throwaway way,
monkeypatched into the table, is found in the sweep plan (a cpu-long run with its pattern and seeds), in the
cost model's prediction (priced by its term, in the figure's speedups and their bands), in gpu-node's timed
ways and predictions, in the figures' styles, and in the README answer's rows and figure as pending (no result
file); before it is added, every one of those lookups misses it (the test can fail). And the table itself:
every key, spelling and colour once."""

import pytest

from test_experiment import fake_results
from tpcomm.costmodel import cost_bands, cost_model as cm
from tpcomm.experiments import gpu_node, readings, sweep_plan
from tpcomm.experiments.report import answer as ans
from tpcomm.experiments.report import report
from tpcomm.figures import way_styles
from tpcomm.experiments import ways
from tpcomm.model.options import compact_list


def _every_third(n):
    return ["spd" if i % 3 == 1 else "parallel" for i in range(n)]  # 24 layers: 8 'spd' and the final sync


TOY = ways.Way("toy-third", "drop", "`toy`: a sync every third block", _every_third,
               price=ways.Price("drop", "toy"), seeds=3, node=ways.Node("toy", "drop: one sync every 3 "
                                                                        "blocks"), style=("#123456", "X"))
ROW = "| drop | `toy`: a sync every third block | pending | pending |"


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory):
    """Made-up result files of cpu-long's runs (two seeds), written before any way is added."""
    root = tmp_path_factory.mktemp("ways")
    fake_results(str(root), "cpu-long", seeds=(1337, 1338))
    return str(root)


def found(root):
    """Where the throwaway way shows: {place: bool}, each looked up as its consumer reads the table."""
    cost_bands.grid.cache_clear()  # the bands are cached per link: computed again from the table as it is now
    runs = {r.name: r for r in sweep_plan.cpu_long_runs()}
    run = runs.get(TOY.key)
    ctx = report.Results(root=root, say=lambda *a: None)
    data, _ = ans.tradeoff_plot(ctx)
    tiny = gpu_node.run_config("tiny", dict(gpu_node.REHEARSAL, shapes=["tiny"], mfu=0.4))
    return {
        "plan": run is not None and run.seeds == sweep_plan.RESOLVED_SEEDS[:3]
        and f"--block_types={compact_list(_every_third(12))}" in run.overrides,
        "pattern name": readings.pattern_name(dict(n_layer=12, block_pattern=compact_list(_every_third(12))))
        == TOY.key,
        "cost model": "toy" in cm.train_variants(cm.FIGURE_SHAPE, tp=8, link=cm.LINKS[0], tokens=8192,
                                                 seq_len=1024,
                                                 mfu=0.4),
        "prediction": TOY.key in cm.predicted_speedups("nvlink")
            and TOY.key in cost_bands.speedup_bands("nvlink"),
        "gpu-node": "toy" in [w[0] for w in gpu_node.timed_ways()]
            and "toy" in gpu_node.predictions(tiny, mfu=0.4),
        "style": way_styles.is_way(TOY.key) and way_styles.style(TOY.key).name == "toy: a sync every third "
            "block",
        "answer rows": ROW in ans.answer_table(ctx),
        "answer figure": any(p["key"] == TOY.key and p["status"] == "pending" for p in data["points"]),
    }


@pytest.fixture
def toy(monkeypatch):
    """The table with the throwaway way added as its last entry, and cpu-long planned from it again (the
    report plans its jobs from sweep_plan.SWEEPS, built at import)."""
    monkeypatch.setattr(ways, "WAYS", (*ways.WAYS, TOY))
    monkeypatch.setitem(sweep_plan.SWEEPS, "cpu-long", sweep_plan.cpu_long_runs())
    yield TOY
    cost_bands.grid.cache_clear()


def test_a_way_is_one_entry(fake_root, monkeypatch):
    before = found(fake_root)
    assert not any(before.values()), before  # the test can fail: without the entry every lookup misses it
    monkeypatch.setattr(ways, "WAYS", (*ways.WAYS, TOY))
    monkeypatch.setitem(sweep_plan.SWEEPS, "cpu-long", sweep_plan.cpu_long_runs())
    try:
        after = found(fake_root)
    finally:
        monkeypatch.undo()
        cost_bands.grid.cache_clear()
    assert all(after.values()), after


def test_the_cost_model_prices_the_new_way_by_its_term(toy):
    """A drop is priced by its forward syncs: 9 for the toy against tracks/4's 6, so 9/6 of its exposed time,
    and its speedup between tracks/4's and ['parallel','spd']'s (12 syncs)."""
    v = cm.train_variants(cm.FIGURE_SHAPE, tp=8, link=cm.LINKS[0], tokens=8192, seq_len=1024, mfu=0.4,
                          async_grad=True)
    assert cm.forward_syncs(_every_third(24)) == 9
    assert v["toy"][1] == pytest.approx(v["tracks/4"][1] * 9 / 6, rel=1e-12)
    s = cm.predicted_speedups("nvlink")
    assert s["parallel-spd"] < s[toy.key] < s["parallel3-spd"]


def test_the_table_names_each_way_once():
    keys = [w.key for w in ways.WAYS]
    assert len(set(keys)) == len(keys)
    assert all(w.category in ways.CATEGORIES for w in ways.WAYS)
    assert all(w.price is None or w.price.term in ways.TERMS for w in ways.WAYS)
    for spelling in (lambda w: w.what, lambda w: w.node and w.node.name, lambda w: w.style and w.style[0]):
        told = [spelling(w) for w in ways.WAYS if spelling(w)]
        assert len(set(told)) == len(told)
    # a trained way's key is its run name: its pattern's name, then '-<dtype>' and '-2shot' as readings names
    # rows
    for w in ways.WAYS:
        if w.seeds:
            row = dict(n_layer=12, block_pattern=compact_list(w.blocks(12)),
                       tp_comm_dtype=w.sync.get("tp_comm_dtype"),
                       tp_comm_exchange=w.sync.get("tp_comm_exchange"),
                       type_options={k: v for k, v in w.sync.items() if k == "caat_sync_fraction"})
            assert readings.pattern_name(row) == w.key
    with pytest.raises(KeyError, match="no way 'nope'"):
        ways.way("nope")
