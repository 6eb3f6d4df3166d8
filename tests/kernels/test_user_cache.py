"""The user cache of tuned tables: layered over the shipped table, keyed by versions, re-read on change."""

import json
import os

import pytest

from specpilot.kernels import configs, user_cache
from specpilot.kernels.configs import Fallback, KernelPath, LaunchConfig, WeightFormat, choose, choose_config
from specpilot.kernels.search import tuned_document

SHIPPED = LaunchConfig(KernelPath.GEMM, block_n=64, block_k=128, num_warps=4)
CACHED = LaunchConfig(KernelPath.GEMM, block_n=128, block_k=256, num_warps=8)
OWN = LaunchConfig(KernelPath.GEMV, block_n=8, block_k=512)


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """A shipped table with rows (w12, 2, 64, 128) and (w12, 4, 64, 128); SPECPILOT_HOME in tmp_path."""
    shipped = tmp_path / "tuned"
    shipped.mkdir()
    doc = tuned_document("NVIDIA H200", {("w12", 2, 64, 128): SHIPPED, ("w12", 4, 64, 128): SHIPPED})
    (shipped / "nvidia_h200.json").write_text(json.dumps(doc))
    monkeypatch.setattr(configs, "TUNED_DIR", shipped)
    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(configs, "RECHECK_S", 0.0)  # every lookup looks at the files (stat)
    configs.tuned_table.cache_clear()
    yield tmp_path
    configs.tuned_table.cache_clear()


def write_cache(path, entries, versions=None):
    """A cache document at `path`: for this process's versions unless `versions` says otherwise."""
    user_cache.write_document(path, tuned_document("NVIDIA H200", entries))
    if versions is not None:
        doc = json.loads(path.read_text())
        path.write_text(json.dumps({**doc, "versions": versions}))


def test_the_versions_key_names_every_version_and_the_cache_lives_under_home(tables):
    v = user_cache.versions()
    assert set(v) == {"torch", "triton", "specpilot", "kernels"} and len(v["kernels"]) == 12
    key = user_cache.versions_key()
    assert key.startswith("torch") and v["kernels"] in key and "/" not in key
    assert user_cache.cache_path("nvidia_h200") == tables / "home" / "kernels" / "nvidia_h200" / f"{key}.json"
    other = user_cache.versions_key({**v, "triton": "0.0.1"})
    assert other != key  # another triton, another file


def test_cache_entries_win_over_the_shipped_table(tables):
    write_cache(user_cache.cache_path("nvidia_h200"), {("w12", 2, 64, 128): CACHED, ("w12", 8, 64, 128): CACHED})
    table = configs.tuned_table("nvidia_h200")
    assert table[("w12", 2, 64, 128)] == CACHED  # the cache's row replaces the shipped one
    assert table[("w12", 4, 64, 128)] == SHIPPED  # the shipped rows the cache lacks stay
    assert choose_config(WeightFormat.W12, 7, 64, 128, "NVIDIA H200") == CACHED  # bucket 8: the cache's only
    assert choose_config(WeightFormat.W12, 2, 64, 128, "NVIDIA H100") != CACHED  # another GPU


def test_a_table_for_other_versions_is_ignored(tables):
    path = user_cache.cache_path("nvidia_h200")
    write_cache(path, {("w12", 2, 64, 128): CACHED}, versions={**user_cache.versions(), "torch": "1.0"})
    assert configs.tuned_table("nvidia_h200")[("w12", 2, 64, 128)] == SHIPPED  # its own record disowns it
    stale = path.with_name(user_cache.versions_key({**user_cache.versions(), "torch": "1.0"}) + ".json")
    write_cache(stale, {("w12", 4, 64, 128): CACHED})  # a file named for other versions is never looked at
    assert configs.tuned_table("nvidia_h200")[("w12", 4, 64, 128)] == SHIPPED


def test_a_changed_cache_file_is_read_again(tables):
    path = user_cache.cache_path("nvidia_h200")
    assert choose_config(WeightFormat.W12, 2, 64, 128, "NVIDIA H200") == SHIPPED  # memoised without a cache
    write_cache(path, {("w12", 2, 64, 128): CACHED})
    assert choose_config(WeightFormat.W12, 2, 64, 128, "NVIDIA H200") == CACHED
    write_cache(path, {("w12", 2, 64, 128): OWN})
    os.utime(path, ns=(1, 1))  # a rewrite within the clock's resolution still differs in size or time
    assert choose_config(WeightFormat.W12, 2, 64, 128, "NVIDIA H200") == OWN
    path.unlink()
    assert choose_config(WeightFormat.W12, 2, 64, 128, "NVIDIA H200") == SHIPPED


def test_a_candidates_table_lies_over_both_and_promotion_merges_it_into_the_cache(tables):
    write_cache(user_cache.cache_path("nvidia_h200"), {("w12", 2, 64, 128): CACHED, ("w12", 4, 64, 128): CACHED})
    own = user_cache.candidate_path("nvidia_h200", "round-3-w12")
    write_cache(own, {("w12", 2, 64, 128): OWN, ("w12", 128, 64, 128): Fallback.UNPACK_CUBLAS})
    assert user_cache.resolve("round-3-w12", "nvidia_h200") == own == user_cache.resolve(str(own), "nvidia_h200")
    assert choose(WeightFormat.W12, 2, 64, 128, "NVIDIA H200", table=str(own)) == OWN
    assert choose(WeightFormat.W12, 2, 64, 128, "NVIDIA H200") == CACHED  # other systems do not see it
    assert choose(WeightFormat.W12, 2, 64, 128, "NVIDIA H100", table=str(own)) != OWN  # an H200's table
    assert choose(WeightFormat.W12, 100, 64, 128, "NVIDIA H200", table="round-3-w12") is Fallback.UNPACK_CUBLAS
    cache = user_cache.promote(own, "nvidia_h200")
    assert cache == user_cache.cache_path("nvidia_h200")
    table = configs.tuned_table("nvidia_h200")
    assert table[("w12", 2, 64, 128)] == OWN and table[("w12", 4, 64, 128)] == CACHED
    assert table[("w12", 128, 64, 128)] is Fallback.UNPACK_CUBLAS
    assert json.loads(cache.read_text())["versions"] == user_cache.versions()


def test_within_the_recheck_time_a_lookup_looks_at_no_file(tables, monkeypatch):
    monkeypatch.setattr(configs, "RECHECK_S", 3600.0)
    assert choose_config(WeightFormat.W12, 2, 64, 128, "NVIDIA H200") == SHIPPED
    write_cache(user_cache.cache_path("nvidia_h200"), {("w12", 2, 64, 128): CACHED})
    with monkeypatch.context() as mp:
        mp.setattr(user_cache, "stamp", lambda path: (_ for _ in ()).throw(AssertionError("a stat")))
        assert choose_config(WeightFormat.W12, 2, 64, 128, "NVIDIA H200") == SHIPPED  # the memo, within the hour
    monkeypatch.setattr(configs, "RECHECK_S", 0.0)
    assert choose_config(WeightFormat.W12, 2, 64, 128, "NVIDIA H200") == CACHED


def test_a_choice_is_memoised_against_its_table_and_follows_a_changed_file(tables, monkeypatch):
    """`choose` runs on every projection call: a repeat reads no table entry and builds no config,
    and a cache file that changed (a new table object) gives its new entry at once."""
    assert choose(WeightFormat.W12, 2, 64, 128, "NVIDIA H200") == SHIPPED
    with monkeypatch.context() as mp:
        mp.setattr(configs, "fallback_rule", lambda *a: (_ for _ in ()).throw(AssertionError("not memoised")))
        mp.setattr(configs, "m_bucket", lambda *a: (_ for _ in ()).throw(AssertionError("not memoised")))
        assert choose(WeightFormat.W12, 2, 64, 128, "NVIDIA H200") == SHIPPED
        untuned = (WeightFormat.W12, 200, 64, 128, "NVIDIA H200")
    assert choose(*untuned) is Fallback.DECODED_CUBLAS  # the rule, above its rows
    write_cache(user_cache.cache_path("nvidia_h200"), {("w12", 2, 64, 128): CACHED,
                                                       ("w12", 256, 64, 128): Fallback.DECODED_CUBLAS})
    assert choose(WeightFormat.W12, 2, 64, 128, "NVIDIA H200") == CACHED  # RECHECK_S is 0 here
    assert choose(*untuned) is Fallback.DECODED_CUBLAS
