"""System and Deployment: validation, TOML round trip, system files as overrides of stock."""

from dataclasses import replace

import pytest

from specpilot.config import (
    Deployment,
    DrafterKind,
    Kernel,
    System,
    TargetFormat,
    load_deployment,
    load_system,
    shipped_deployments_dir,
)
from specpilot.errors import ConfigError


def test_defaults_mirror_sglang():
    s = System()
    assert (s.depth, s.topk, s.tree_budget) == (5, 4, 7)  # num_steps 5, eagle_topk 4, 8 draft tokens incl. root


def test_toml_round_trip(tmp_path):
    import tomllib

    s = System(name="x", depth=7, topk=2, tree_budget=20, adaptive_depth=(4, 8), kernel=Kernel.TRITON, w12=True)
    assert System.from_dict(tomllib.loads(s.to_toml())) == s


@pytest.mark.parametrize("kw,message", [
    ({"tree_budget": 0}, "tree_budget must be >= 1"),
    ({"depth": 0}, "depth must be >= 1"),
    ({"w12": True}, "needs kernel = 'triton'"),
    ({"draft_window": 3, "depth": 5}, "would lose accepted tokens"),
    ({"draft_window": 6, "depth": 5, "adaptive_depth": (3, 7)}, "deepest adaptive_depth tier \\+ 1 = 8"),
    ({"sync_every": 0}, "sync_every"),
])
def test_impossible_systems(kw, message):
    with pytest.raises(ConfigError, match=message):
        System(**kw)


def test_unknown_knob_and_bad_enum():
    with pytest.raises(ConfigError, match="unknown system knob"):
        System.from_dict({"dept": 3})
    with pytest.raises(ConfigError, match="drafter"):
        System.from_dict({"drafter": "eagle9"})


def test_system_file_overrides_stock(tmp_path):
    dep = Deployment(name="d", target="t", stock=System(depth=6, topk=3, tree_budget=10))
    f = tmp_path / "deep.toml"
    f.write_text('depth = 9\ntree_budget = 30\n')
    s = load_system(str(f), dep)
    assert (s.name, s.depth, s.topk, s.tree_budget) == ("deep", 9, 3, 30)
    assert s.diff(dep.stock) == {"depth": [6, 9], "tree_budget": [10, 30]}
    assert load_system("ar", dep).drafter is DrafterKind.NONE
    with pytest.raises(ConfigError, match="neither"):
        load_system(str(tmp_path / "missing.toml"), dep)


def test_plain_ar_of_a_system_with_every_batch_mechanism_is_valid_and_keeps_the_engine():
    """AR of a system resets the knobs only speculation reads (segment admission cannot ride in an AR
    forward) and keeps everything else; a stock with segment admission still has an AR."""
    s = System(name="all", drafter=DrafterKind.EAGLE3, depth=6, tree_budget=16, adaptive_depth=(4, 8),
               shared_budget=8, row_depth_margin=1, segment_tokens=7, kernel=Kernel.TRITON, attention_span=128)
    with pytest.raises(ConfigError, match="segment_tokens rides"):
        s.with_changes(drafter=DrafterKind.NONE)
    ar = s.plain_ar()
    assert (ar.name, ar.drafter, ar.adaptive_depth, ar.shared_budget, ar.row_depth_margin, ar.segment_tokens) == (
        "ar", DrafterKind.NONE, (), 0, 0, 0)
    assert set(ar.diff(s)) == {"drafter", "adaptive_depth", "shared_budget", "row_depth_margin", "segment_tokens"}
    assert s.plain_ar("stock-ar").name == "stock-ar"
    assert load_system("ar", Deployment(name="d", target="t", stock=s)) == ar


def test_deployment_validation(tmp_path):
    with pytest.raises(ConfigError, match="powers of two"):
        Deployment(name="d", target="t", target_expand=3)
    with pytest.raises(ConfigError, match="unknown benchmark set"):
        Deployment(name="d", target="t", sets=("gsm8k", "imagenet"))
    f = tmp_path / "d.toml"
    f.write_text('name = "d"\ntarget = "models/t"\ndrafter = "ngram"\n[regime]\nbatch = 4\n[stock]\ndepth = 3\ntopk = 1\ntree_budget = 3\n')
    d = Deployment.from_toml(f)
    assert d.target == str((tmp_path / "models/t").resolve()) and d.drafter == "ngram"
    assert d.regime.batch == 4 and d.stock.depth == 3
    f.write_text("name = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Deployment.from_toml(f)


def test_target_format_is_validated_and_reads_back(tmp_path):
    with pytest.raises(ConfigError, match=r"target_format 'fp8' is not one of '', 'fp8-channel', 'fp8-block'"):
        Deployment(name="d", target="t", target_format="fp8")
    f = tmp_path / "d.toml"
    f.write_text('name = "d"\ntarget = "fixture"\ntarget_format = "fp8-blocks"\n')
    with pytest.raises(ConfigError, match="target_format 'fp8-blocks'"):
        Deployment.from_toml(f)
    for fmt in TargetFormat:
        dep = Deployment(name="d", target="fixture", target_format=fmt.value)
        assert dep.target_format is fmt
        f.write_text(dep.to_toml())
        assert replace(Deployment.from_toml(f), source="") == dep
        assert ("target_format" in dep.to_toml()) == (fmt is not TargetFormat.STORED)


def test_target_format_enters_the_fingerprint_only_when_set():
    stored = Deployment(name="d", target="fixture")
    fp8 = replace(stored, target_format=TargetFormat.FP8_CHANNEL)
    assert "target_format" not in stored.fingerprint_fields()  # fingerprints from before the field stay
    assert fp8.fingerprint_fields() == {**stored.fingerprint_fields(), "target_format": "fp8-channel"}


@pytest.mark.parametrize("path", sorted(shipped_deployments_dir().glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_deployment_loads_reads_back_and_says_what_it_is(path, tmp_path):
    dep = load_deployment(path.stem)
    assert dep.name == path.stem and path.read_text().startswith("#")  # a header comment: what it stands in for
    again = tmp_path / path.name
    again.write_text(dep.to_toml())
    assert replace(Deployment.from_toml(again), source="") == replace(dep, source="")
