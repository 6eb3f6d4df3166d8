"""The launch-config search (specpilot.kernels.search, .timing): its phases, the selection within a
budget and the tuned table, on CPU with a fake timer; one real check of a config in the interpreter."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from specpilot.kernels import configs as kc
from specpilot.kernels import search, timing
from specpilot.kernels.configs import KernelPath, LaunchConfig, WeightFormat
from specpilot.kernels.search import OutOfBudget, Problem, SearchResult, SearchSettings, Trial

W12, DENSE = WeightFormat.W12, WeightFormat.DENSE


def timed(cfg: LaunchConfig, us: float) -> Trial:
    return Trial(cfg, us=us)


def at(M: int, fmt: WeightFormat = W12, N: int = 4096, K: int = 4096) -> Problem:
    return Problem(fmt, N, K, M)


class FakeTimer:
    """µs from a deterministic function of the config (or `table`); `broken` configs fail the check."""

    def __init__(self, table=None, broken=()):
        self.table, self.broken, self.calls = table or {}, set(broken), []

    def __call__(self, problem: Problem, config: LaunchConfig) -> Trial:
        self.calls.append((problem, config))
        if config in self.broken:
            return Trial(config, worst_error_over_bound=4.0, error="exceeds the error bound")
        us = self.table.get(config, 50.0 + sum(map(ord, config.label())) % 97 + problem.m / 8)
        return Trial(config, us=us, worst_error_over_bound=0.5)


# -- the phases -------------------------------------------------------------------------------------
def test_gather_t_variants_take_the_fastest_gemm_configs():
    fast = LaunchConfig(KernelPath.GEMM, 64, 256, num_stages=3, split_k=2)
    second = LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3)
    tried = [timed(LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=4), 30.0), timed(fast, 10.0),
             timed(LaunchConfig(KernelPath.GEMV, 4, 1024), 5.0),  # the GEMV has no escape blocks
             Trial(second, error="exceeds the error bound"), timed(second, 20.0)]
    out = search.gather_t_variants(tried, at(32))
    assert [c.label() for c in out] == [f"{fast.label()} xT", f"{second.label()} xT"]
    assert search.gather_t_variants(tried, at(16)) == []  # below GATHER_T_MIN_M
    assert search.gather_t_variants(tried, at(32, DENSE)) == []  # plain weights have no escapes


def test_resident_variants_cap_the_fastest_4_warp_configs():
    fast = LaunchConfig(KernelPath.GEMM, 64, 256, num_stages=3, split_k=3, gather_t=True)
    eight = LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3)
    tried = [timed(eight, 5.0), timed(fast, 10.0), timed(LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=4), 12.0)]
    out = search.resident_variants(tried, at(32))
    assert all(c.resident == 3 and c.num_warps == 4 for c in out)  # 8 warps at three per SM would spill
    assert out[0] == LaunchConfig(KernelPath.GEMM, 64, 256, num_stages=3, split_k=3, gather_t=True, resident=3)
    assert LaunchConfig(KernelPath.GEMM, 64, 256, num_stages=2, split_k=3, gather_t=True, resident=3) in out
    assert search.resident_variants(tried, at(16)) == []
    assert search.resident_variants([timed(out[0], 1.0)], at(32)) == []  # capped ones are not capped again


def test_tma_variants_take_the_fastest_gemm_configs_of_every_phase():
    capped = LaunchConfig(KernelPath.GEMM, 64, 256, num_stages=2, split_k=3, gather_t=True, resident=3)
    plain = LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=4)
    eight = LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3)
    tried = [timed(LaunchConfig(KernelPath.GEMV, 4, 1024), 1.0), timed(plain, 12.0), timed(capped, 10.0),
             timed(eight, 30.0)]
    out = search.tma_variants(tried, at(1))
    assert out == [dataclasses.replace(capped, tma=True), dataclasses.replace(plain, tma=True)]  # no GEMV
    assert search.tma_variants([timed(out[0], 1.0)], at(1)) == []  # TMA configs are not varied again
    # from 16 rows also every phase-1 tile (a candidate at the automatic split), however slow
    assert eight in kc.gemm_candidates(32)
    wide = search.tma_variants(tried, at(32))
    assert wide[:2] == out and dataclasses.replace(eight, tma=True) in wide
    assert dataclasses.replace(capped, tma=True) in wide and len(wide) == len(set(wide))


def test_tma_x_variants_take_the_fastest_gemm_configs_from_16_rows():
    tma = LaunchConfig(KernelPath.GEMM, 64, 256, num_stages=3, split_k=3, tma=True)
    wide = LaunchConfig(KernelPath.GEMM, 64, 512, num_stages=2)  # a K step no TMA box of x holds
    tried = [timed(LaunchConfig(KernelPath.GEMV, 4, 1024), 1.0), timed(wide, 2.0), timed(tma, 10.0),
             timed(LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=4), 12.0),
             timed(LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3), 30.0),
             timed(LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=3), 40.0)]
    out = search.tma_x_variants(tried, at(32))
    assert out == [dataclasses.replace(tma, tma_x=True), LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=4, tma_x=True),
                   LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3, tma_x=True)]
    assert search.tma_x_variants(tried, at(8)) == []  # below TMA_X_MIN_M
    assert search.tma_x_variants([timed(out[0], 1.0)], at(32)) == []  # tma_x configs are not varied again


def test_tma_final_variants_give_weight_tma_to_the_fastest_configs_still_without_it():
    won = LaunchConfig(KernelPath.GEMM, 64, 256, num_stages=3, gather_t=True, resident=3, tma_x=True)  # phase 5's
    both = LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=3, tma=True, tma_x=True)
    plain = LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3)
    tried = [timed(LaunchConfig(KernelPath.GEMV, 4, 1024), 1.0), timed(won, 10.0), timed(both, 11.0),
             timed(plain, 12.0), timed(LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=4), 13.0)]
    out = search.tma_final_variants(tried)
    assert out == [dataclasses.replace(won, tma=True), dataclasses.replace(plain, tma=True)]
    assert search.tma_final_variants(tried + [timed(out[0], 11.5)]) == [out[1]]  # a twin timed already is not again
    assert out[0] in search.sweep_binaries(32)  # phase 5's binaries cover them


def test_split_variants_give_near_best_configs_a_split_that_fits_one_wave():
    """Qwen3-32B down (5120 x 25600): 40 row tiles of n128 split 7 ways automatically = 280
    programs for 264 slots on 132 SMs; the variant splits 6 ways. The n64 tiles (80 x 4 = 320
    programs) overshoot too and get 3; a config with an explicit split or far from the fastest
    gets none."""
    n64 = LaunchConfig(KernelPath.GEMM, 64, 256, num_stages=2, resident=3)
    n128 = LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3)
    slow = LaunchConfig(KernelPath.GEMM, 128, 256, num_warps=8, num_stages=2)
    fixed = LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=3, split_k=4)
    assert search.one_wave_split(n128, 5120, 25600, 132) == dataclasses.replace(n128, split_k=6)
    assert search.one_wave_split(fixed, 5120, 25600, 132) is None
    assert search.one_wave_split(n64, 51200, 5120, 132) is None  # 800 row tiles: no split, one program each
    tried = [timed(n64, 64.0), timed(n128, 80.0), timed(slow, 90.0), timed(fixed, 66.0)]
    out = search.split_variants(tried, at(64, N=5120, K=25600), 132)
    assert dataclasses.replace(n128, split_k=6) in out
    assert dataclasses.replace(n64, split_k=3) in out
    assert not any(c.block_n == 128 and c.block_k == 256 and c.split_k for c in out)  # 90 > 1.3 x 64
    assert len(out) == len(set(out))


def test_one_wave_split_leaves_a_config_that_already_rounds_down():
    fw = LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3, fit_wave=True)
    assert search.one_wave_split(fw, 5120, 25600, 132) is None


def test_explicit_splits_of_the_rounding_heuristic_tile_are_valid_configs():
    """The heuristic 8-warp tile rounds its automatic split (fit_wave); its explicit-split
    variants must drop that, which LaunchConfig rejects beside split_k."""
    fw = LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3, fit_wave=True)
    out = search.split_variants([timed(fw, 30.0)], at(32, N=10240, K=5120), 132)  # 80 row tiles
    assert [c.split_k for c in out if c.split_k] == list(search.EXPLICIT_SPLITS)
    assert not any(c.fit_wave for c in out if c.split_k)


# -- the search -------------------------------------------------------------------------------------
def test_a_sweep_times_every_candidate_and_every_phase_once_and_keeps_the_fastest_correct_config():
    p = at(32)
    tile = kc.gemm_candidates(32)[2]
    fastest = dataclasses.replace(tile, tma=True, tma_x=True)  # phase 5's form of phase 4's form of a tile
    broken = kc.gemm_candidates(32)[0]
    timer = FakeTimer({tile: 2.0, dataclasses.replace(tile, tma=True): 3.0, fastest: 1.0}, broken=[broken])
    (result,) = search.tune([p], timer, SearchSettings())
    configs = [c for _, c in timer.calls]
    assert len(configs) == len(set(configs)) == len(result.tried)  # none twice
    assert set(kc.candidates(32)) | {kc.heuristic_config(32, W12, p.n, p.k)} <= set(configs)
    assert result.swept and result.best.config == fastest and result.best.us == 1.0
    assert broken in configs and all(t.us is None for t in result.tried if t.config == broken)
    assert any(c.resident == 3 for c in configs) and any(c.gather_t for c in configs)
    assert result.heuristic_us == next(t.us for t in result.tried if t.config == result.heuristic)
    d = result.to_dict()
    assert d["best_config"] == fastest.label() and d["best_us"] == 1.0 and d["swept"] is True
    assert [list(t) for t in d["tried"][:2]] == [["config", "label", "worst_error_over_bound", "error"],
                                                 ["config", "label", "worst_error_over_bound", "us"]]


def test_without_a_sweep_only_the_defaults_and_the_heuristic_are_timed():
    p = at(8, DENSE, 1000, 1000)
    timer = FakeTimer()
    (result,) = search.tune([p], timer, SearchSettings(sweep=False))
    assert [c for _, c in timer.calls] == list(dict.fromkeys(
        search.default_configs(8) + [kc.heuristic_config(8, DENSE, 1000, 1000)]))
    assert not result.swept and result.best == min(result.tried, key=lambda t: t.us)


def test_known_trials_rank_with_the_rest_and_are_not_timed_again():
    p = at(1, DENSE)
    today = kc.candidates(1)[0]
    timer = FakeTimer()
    (result,) = search.tune([p], timer, SearchSettings(), known={p: [timed(today, 0.5)]})
    assert today not in [c for _, c in timer.calls]
    assert result.tried[0] == timed(today, 0.5) and result.best.config == today


def test_the_budget_sweeps_the_problems_reached_in_time_and_then_defaults_or_nothing():
    problems = [at(1), at(32), at(8, DENSE)]
    now = iter([0.0, 1.0, 11.0, 12.0])  # started, then before each problem
    results = search.tune(problems, FakeTimer(), SearchSettings(budget_s=10.0), clock=lambda: next(now))
    assert [r.swept for r in results] == [True, False, False]
    assert len(results[1].tried) == len(dict.fromkeys(search.default_configs(32) + [results[1].heuristic]))
    skip = SearchSettings(budget_s=10.0, out_of_budget=OutOfBudget.SKIP)
    known = {problems[2]: [timed(kc.candidates(8)[0], 3.0)]}
    now = iter([0.0, 1.0, 11.0, 12.0])
    timer = FakeTimer()
    results = search.tune(problems, timer, skip, known=known, clock=lambda: next(now))
    assert {p for p, _ in timer.calls} == {problems[0]}
    assert results[1].tried == () and results[1].best is None
    assert results[2].tried == tuple(known[problems[2]]) and results[2].best.us == 3.0


def test_no_config_passing_the_check_leaves_no_best():
    p = at(1)
    everything = search.sweep_binaries(1) + [kc.heuristic_config(1, W12, p.n, p.k)]
    (result,) = search.tune([p], FakeTimer(broken=everything), SearchSettings(sweep=False))
    assert result.best is None and result.to_dict()["best_config"] is None


# -- the tuned table --------------------------------------------------------------------------------
def run(commit: str, rows: list[tuple[int, LaunchConfig, bool]]) -> dict:
    """A run document of one W12 [64, 128] projection: each row's search found `cfg`."""
    timings = []
    for M, cfg, swept in rows:
        found = SearchResult(at(M, N=64, K=128), (timed(cfg, 1.0),), swept, cfg, timed(cfg, 1.0))
        timings.append({"N": 64, "K": 128, "M": M, search.RUN_KEYS[W12]: found.to_dict()})
    return {"meta": {"gpu": "NVIDIA H200", "git_commit": commit}, "timings": timings}


def test_merge_tuned_keeps_the_older_run_where_the_newer_did_not_sweep():
    a, b, c = (LaunchConfig(KernelPath.GEMM, 64, k, num_stages=3) for k in (128, 256, 512))
    old = run("old", [(1, a, True), (32, a, True)])
    new = run("new", [(1, b, False), (32, c, True), (64, b, False)])
    table = search.merge_tuned(new, old)
    got = {e["m"]: LaunchConfig.from_dict(e["config"]) for e in table["entries"]}
    assert got == {1: a, 32: c, 64: b}  # 1: the new run only timed defaults; 64: nothing older to keep
    assert table["merged_from"] == ["new", "old"] and {e["format"] for e in table["entries"]} == {"w12"}


def test_merge_tuned_into_a_tuned_table_keeps_its_other_rows():
    """OLD may be a tuned table (the shipped one): a run of some row counts replaces only the rows it swept."""
    a, b, c = (LaunchConfig(KernelPath.GEMM, 64, k, num_stages=3) for k in (128, 256, 512))
    shipped = search.merge_tuned(run("x", [(1, a, True), (32, a, True)]), run("y", [(64, c, True)]))
    new = run("new", [(1, b, True), (2, b, False)])
    table = search.merge_tuned(new, shipped)
    got = {e["m"]: LaunchConfig.from_dict(e["config"]) for e in table["entries"]}
    assert got == {1: b, 2: b, 32: a, 64: c}
    assert table["merged_from"] == ["new", "x", "y"]


def test_the_best_configs_of_a_search_are_a_table_the_dispatcher_reads(tmp_path, monkeypatch):
    problems = [at(1, N=64, K=128), at(24, N=64, K=128), at(24, DENSE, N=64, K=128)]
    results = search.tune(problems, FakeTimer(), SearchSettings(sweep=False))
    best = search.best_configs(results)
    assert set(best) == {("w12", 1, 64, 128), ("w12", 32, 64, 128), ("dense", 32, 64, 128)}  # M buckets
    doc = search.tuned_document("NVIDIA H200", best, written_by="test")
    assert list(doc) == ["device", "written_by", "entries"]
    (tmp_path / "nvidia_h200.json").write_text(json.dumps(doc))
    monkeypatch.setattr(kc, "TUNED_DIR", tmp_path)
    kc.tuned_table.cache_clear()
    try:
        for r in results:
            assert kc.choose_config(r.problem.fmt, r.problem.m, 64, 128, "NVIDIA H200") == r.best.config
    finally:
        kc.tuned_table.cache_clear()


# -- timing -----------------------------------------------------------------------------------------
def test_rotated_rounds_times_every_arm_once_per_round_in_rotated_order(monkeypatch):
    order = []
    speeds = {"a": [3.0, 2.0, 4.0], "b": [5.0, 6.0, 1.5], "c": [7.0, 7.0, 7.0]}
    monkeypatch.setattr(timing, "warm_clocks", lambda: order.append("warm"))
    monkeypatch.setattr(timing, "graph_time_us", lambda calls: (order.append(calls[0]), speeds[calls[0]].pop(0))[1])
    best, runs = timing.rotated_rounds({"a": ["a"], "b": ["b"], "c": ["c"]})
    assert order == ["warm", "a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert best == {"a": 2.0, "b": 1.5, "c": 7.0}
    assert runs == {"a": [3.0, 2.0, 4.0], "b": [5.0, 6.0, 1.5], "c": [7.0, 7.0, 7.0]}


def test_the_timer_checks_a_config_and_times_only_one_within_the_bound(make_weight, make_x, monkeypatch):
    """A real GEMV launch (the interpreter on CPU) passes the check; an output off by one part in
    100 fails it and is never timed; an exception is a Trial's error."""
    from specpilot.w12 import encode

    x = make_x(1, 256).bfloat16()  # [1, 256] on the test device
    w = encode(make_weight(16, 256).to(x.device))
    p = Problem(W12, 16, 256, 1)
    cfg = LaunchConfig(KernelPath.GEMV, block_n=8, block_k=256, num_warps=2)
    sets_timed = []
    timer = timing.GraphTimer(lambda q: [w, w], lambda q: x, time_calls=lambda calls: sets_timed.append(len(calls)) or 7.0)
    trial = timer(p, cfg)
    assert trial.us == 7.0 and trial.error is None and trial.worst_error_over_bound <= 1.0 and sets_timed == [2]
    y = timing.run_config(x, w, cfg)
    monkeypatch.setattr(timing, "run_config", lambda *a: torch.where(torch.isfinite(y), y * 1.01, y))
    bad = timer(p, cfg)
    assert bad.us is None and bad.error == "exceeds the error bound" and bad.worst_error_over_bound > 1.0
    assert sets_timed == [2]
    monkeypatch.setattr(timing, "run_config", lambda *a: (_ for _ in ()).throw(RuntimeError("no\nmore")))
    assert timer(p, cfg).error == "RuntimeError: no"


@pytest.mark.parametrize("fallback", list(kc.Fallback))
def test_the_timer_times_decode_then_cublas_over_every_weight_set(make_weight, make_x, fallback):
    """`time_fallback` runs the path a `Fallback` dispatches to, on each set: the calls give
    decode + F.linear bit for bit."""
    from specpilot.w12 import decode, encode

    x = make_x(2, 256).bfloat16()
    w = encode(make_weight(16, 256).to(x.device))
    outputs = []
    timer = timing.GraphTimer(lambda q: [w, w], lambda q: x,
                              time_calls=lambda calls: outputs.extend(c() for c in calls) or 5.0)
    assert timer.time_fallback(Problem(W12, 16, 256, 2), fallback) == 5.0 and len(outputs) == 2
    expected = torch.nn.functional.linear(x, decode(w).to(x.dtype))
    assert all(torch.equal(y.view(torch.int16), expected.view(torch.int16)) for y in outputs)


def test_importing_the_search_needs_no_triton():
    code = "import sys, specpilot.kernels.search, specpilot.kernels.timing; assert 'triton' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
