"""A system carrying a patch is measured from its worktree: the profile and the final benchmark run its code."""

from pathlib import Path

import pytest

from specpilot.config import Deployment
from specpilot.loop.final import bench_config, measure_final
from specpilot.loop.measure import measure_in_worktree
from specpilot.loop.systems import Candidate
from specpilot.loop.worktree import Checkout, package_checkout

pytestmark = pytest.mark.slow  # the loop's profile and final benchmark, run from a worktree

# appended by the "patch": observable marks in what the worktree's code returns
COST_MARK = '''
_unpatched_analyze = analyze


def analyze(*args, **kwargs):
    from dataclasses import replace

    table = _unpatched_analyze(*args, **kwargs)
    return replace(table, system=table.system + " (patched)")
'''
BENCH_MARK = '\nSCHEMA = "specpilot.bench/1+patched"\n'
SERVING_MARK = '\nSCHEMA = "specpilot.serving/1+patched"\n'


@pytest.fixture(scope="module")
def patched(tmp_path_factory, target_dir, drafter_dir):
    root = package_checkout()
    if root is None:
        pytest.skip("the package is not imported from a git checkout")
    tmp = tmp_path_factory.mktemp("patched")
    dep_file = tmp / "tiny.toml"
    dep_file.write_text(f'name = "tiny"\ntarget = "{target_dir}"\ndrafter = "{drafter_dir}"\nmax_new_tokens = 8\n'
                        "[stock]\ndepth = 2\ntopk = 2\ntree_budget = 3\n")
    wt = Checkout.capture(root).create(tmp / "wt")
    for rel, text in (("specpilot/loop/cost_model.py", COST_MARK), ("specpilot/bench/results.py", BENCH_MARK),
                      ("specpilot/bench/serving_results.py", SERVING_MARK)):
        path = wt.path / rel
        path.write_text(path.read_text() + text)
    yield Deployment.from_toml(dep_file), str(dep_file), wt, tmp
    wt.remove()


def test_the_profile_of_a_patched_incumbent_comes_from_its_worktree(patched):
    dep, dep_file, wt, _ = patched
    system = dep.stock.with_changes(name="chain")
    table = measure_in_worktree(str(wt.path), dep_file, system, [[[5, 6, 7]], [[8, 9]]], 8, "cpu")
    assert table.system == "chain (patched)" and table.shape.depth == 2 and table.tokens_per_round >= 1


def test_the_final_benchmark_of_a_patched_system_runs_its_code(patched):
    dep, dep_file, wt, tmp = patched
    stock = Candidate(dep.stock)
    final = Candidate(dep.stock.with_changes(name="mine", topk=1), wt.diff(), str(wt.path))
    config = bench_config(dep, prompts_per_set=2, max_new_tokens=6)
    assert (config.n_prompts, config.max_new_tokens) == (2, 6)
    result = measure_final(None, dep, dep_file, stock, final, config, tmp, heldout_prompts=5)
    assert result.bench["schema"] == "specpilot.bench/1+patched" and "patched code" in result.note
    assert [s["name"] for s in result.bench["systems"]] == ["stock", "final"] and result.final_gain is not None
    # the held-out run: `specpilot bench --sets heldout` in the same worktree
    assert result.heldout["schema"] == "specpilot.bench/1+patched" and result.heldout_note == ""
    assert result.heldout["config"]["sets"] == ["heldout"] and result.heldout["config"]["n_prompts"] == 5
    assert result.heldout_gain is not None and result.heldout_gain["low"] is not None


def test_the_final_serving_run_of_a_patched_system_runs_its_code(patched):
    """A continuous deployment's final measurement from the worktree is `specpilot bench --regime
    serving` at the regime's concurrency, read back from its results.json."""
    dep, dep_file, wt, tmp = patched
    served = tmp / "served.toml"
    served.write_text(Path(dep_file).read_text().replace("[stock]", "[regime]\nbatch = 2\ncontinuous = true\n[stock]"))
    dep = Deployment.from_toml(served)
    stock = Candidate(dep.stock)
    final = Candidate(dep.stock.with_changes(name="mine", topk=1), wt.diff(), str(wt.path))
    result = measure_final(None, dep, str(served), stock, final, bench_config(dep, 2, 6), tmp)
    assert result.bench["schema"] == "specpilot.serving/1+patched" and result.serving and "patched code" in result.note
    command = result.bench["command"]
    assert command[command.index("--regime") + 1] == "serving" and command[command.index("--concurrency") + 1] == "2"
    (level,) = result.bench["levels"]
    assert [e["name"] for e in level["engines"]] == ["ar", "stock", "final"] and level["units"] == 5
    assert result.final_gain is not None and result.final_gain["estimate"] > 0
