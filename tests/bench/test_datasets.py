from pathlib import Path

import pytest

from specpilot.bench.datasets import SETS, check_set_names, datasets_dir, load_set, select, subset
from specpilot.config import BENCHMARK_SETS
from specpilot.errors import ConfigError

SIZES = {"gsm8k": 1319, "math500": 500, "humaneval": 164, "mbpp": 500, "mt_bench": 80}


@pytest.mark.parametrize("name", BENCHMARK_SETS)
def test_every_set_loads_with_unique_ids_and_text(name):
    examples = load_set(name)
    assert len(examples) == SIZES[name]
    assert len({e.source_id for e in examples}) == len(examples)
    assert all(e.text.strip() and e.set_name == name for e in examples)
    assert [e.index for e in examples] == list(range(len(examples)))


def test_mbpp_is_the_test_split_and_mt_bench_the_first_turn():
    ids = [int(e.source_id.split("/")[1]) for e in load_set("mbpp")]
    assert ids == list(range(11, 511))
    first = load_set("mt_bench")[0]
    assert first.source_id == "mt_bench/81" and first.text.startswith("Compose an engaging travel blog post")
    assert load_set("humaneval")[0].source_id == "HumanEval/0"


def test_subsets_are_deterministic_nested_and_seeded():
    examples = load_set("gsm8k")
    ten, twenty = subset(examples, 10, seed=0), subset(examples, 20, seed=0)
    assert ten == subset(examples, 10, seed=0)
    assert twenty[:10] == ten
    assert {e.source_id for e in subset(examples, 10, seed=1)} != {e.source_id for e in ten}
    assert len(subset(examples, 0)) == len(examples)


def test_subset_is_pinned():
    # the draw is a hash order, identical on every machine and library version
    pinned = ["HumanEval/99", "HumanEval/65", "HumanEval/34"]
    assert [e.source_id for e in subset(load_set("humaneval"), 3, seed=0)] == pinned


def test_select_and_bad_names():
    chosen = select(["mbpp", "gsm8k"], 3)
    assert [e.set_name for e in chosen] == ["mbpp"] * 3 + ["gsm8k"] * 3
    with pytest.raises(ConfigError, match="unknown benchmark set"):
        check_set_names(["gsm8k", "gsm8"])
    with pytest.raises(ConfigError, match="listed twice"):
        check_set_names(["gsm8k", "gsm8k"])
    with pytest.raises(ConfigError, match="cannot draw 81"):
        select(["mt_bench"], 81)


def test_readme_lists_every_set_and_its_license():
    readme = (datasets_dir() / "README.md").read_text()
    for spec in SETS.values():
        assert f"`{spec.name}`" in readme and spec.license in readme
        assert (datasets_dir() / spec.file).is_file()
    for name in ("gsm8k", "math500", "humaneval", "mt_bench"):
        assert Path(datasets_dir() / name / "LICENSE").is_file()
