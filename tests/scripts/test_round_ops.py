"""scripts/round_ops.py: the operations of one EAGLE-3 round on CPU, by engine function. Guards the
round's glue against regrowing (each operation is a kernel launch on a GPU): the tree's ancestors by
path doubling, not a walk per level, and the glue below what it was before (390 at 8300f29)."""

from pathlib import Path

SYSTEM = Path(__file__).resolve().parents[2] / "scripts" / "systems" / "eagle3-d6k4n16-segment-7.toml"


def test_one_eagle3_round_launches_few_glue_operations(bench_script):
    ops = bench_script("round_ops")
    counts, name, _ = ops.count_round("fixture-x16-batch", str(SYSTEM), concurrency=2)
    by_fn = ops.by_function(counts)
    assert name == "eagle3-d6k4n16-segment-7"
    assert by_fn["engine/steps.py:tree_forward [model]"] > 0 and by_fn["engine/drafters/best_first.py:expand"] > 0
    assert by_fn["engine/tree.py:ancestors_of"] <= 20  # a walk up 7 levels is ~66
    glue = sum(n for w, n in by_fn.items() if not w.endswith("[model]"))
    assert glue < 330, by_fn.most_common(12)
