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


def test_a_checkout_in_a_folder_named_specpilot_counts_the_same_places(bench_script, monkeypatch):
    """git clones into a folder named `specpilot`, and a venv may live inside it: the frames of torch and
    of the script itself then sit under `.../specpilot/` too, and only the package's own files may
    count. The path the matcher sees is moved there for every file outside the package."""
    import traceback
    from types import SimpleNamespace

    import torch

    import specpilot
    from specpilot.engine.tree import ancestors_of

    ops = bench_script("round_ops")
    package = str(Path(specpilot.__file__).resolve().parent)

    def extract_stack():
        return [f if f.filename.startswith(package) else
                traceback.FrameSummary("/home/user/specpilot/.venv" + f.filename, f.lineno, f.name, line="")
                for f in traceback.extract_stack()[:-1]]

    monkeypatch.setattr(ops, "traceback", SimpleNamespace(extract_stack=extract_stack))
    counter = ops.Counter()
    with counter:
        ancestors_of(torch.tensor([[-1, 0, 1]]), 2)
    assert counter.counts and {where for where, _ in counter.counts} == {"engine/tree.py:ancestors_of"}
