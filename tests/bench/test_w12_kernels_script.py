"""bench/w12_kernels.py (the GPU sweep): which configs its later phases try, without a GPU."""

import dataclasses

import pytest

from specpilot.kernels.configs import KernelPath, LaunchConfig, WeightFormat


@pytest.fixture(scope="module")
def sweep(bench_script):
    return bench_script("w12_kernels")


def timed(cfg: LaunchConfig, us: float) -> dict:
    return {"config": cfg.to_dict(), "label": cfg.label(), "us": us}


def test_gather_t_variants_take_the_fastest_gemm_configs(sweep):
    fast = LaunchConfig(KernelPath.GEMM, 64, 256, num_stages=3, split_k=2)
    second = LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3)
    tried = [timed(LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=4), 30.0), timed(fast, 10.0),
             timed(LaunchConfig(KernelPath.GEMV, 4, 1024), 5.0),  # the GEMV has no escape blocks
             {"config": second.to_dict(), "label": second.label(), "error": "exceeds the error bound"},
             timed(second, 20.0)]
    out = sweep.gather_t_variants(tried, 32, WeightFormat.W12)
    assert [c.label() for c in out] == [f"{fast.label()} xT", f"{second.label()} xT"]
    assert sweep.gather_t_variants(tried, 16, WeightFormat.W12) == []  # below GATHER_T_MIN_M
    assert sweep.gather_t_variants(tried, 32, WeightFormat.DENSE) == []  # plain weights have no escapes


def test_precompile_covers_the_gather_t_binaries(sweep):
    problems = sweep.compile_problems(False, sweep.MODELS[:1], (1, 32))
    assert any(c.gather_t and M == 32 for _, _, M, c in problems)
    assert not any(c.gather_t and M == 1 for _, _, M, c in problems)


def test_resident_variants_cap_the_fastest_4_warp_configs(sweep):
    fast = LaunchConfig(KernelPath.GEMM, 64, 256, num_stages=3, split_k=3, gather_t=True)
    eight = LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3)
    tried = [timed(eight, 5.0), timed(fast, 10.0), timed(LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=4), 12.0)]
    out = sweep.resident_variants(tried, 32)
    assert all(c.resident == 3 and c.num_warps == 4 for c in out)  # 8 warps at three per SM would spill
    assert out[0] == LaunchConfig(KernelPath.GEMM, 64, 256, num_stages=3, split_k=3, gather_t=True, resident=3)
    assert LaunchConfig(KernelPath.GEMM, 64, 256, num_stages=2, split_k=3, gather_t=True, resident=3) in out
    assert sweep.resident_variants(tried, 16) == []
    assert sweep.resident_variants([timed(out[0], 1.0)], 32) == []  # capped ones are not capped again


def test_tma_variants_take_the_fastest_gemm_configs_of_every_phase(sweep):
    capped = LaunchConfig(KernelPath.GEMM, 64, 256, num_stages=2, split_k=3, gather_t=True, resident=3)
    plain = LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=4)
    tried = [timed(LaunchConfig(KernelPath.GEMV, 4, 1024), 1.0), timed(plain, 12.0), timed(capped, 10.0),
             timed(LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3), 30.0)]
    out = sweep.tma_variants(tried, 1)
    assert out == [dataclasses.replace(capped, tma=True), dataclasses.replace(plain, tma=True)]  # no GEMV
    assert sweep.tma_variants([timed(out[0], 1.0)], 1) == []  # TMA configs are not varied again
    # from 16 rows also every phase-1 tile (a candidate at the automatic split), however slow
    eight = LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3)
    assert eight in sweep.kc.gemm_candidates(32)
    wide = sweep.tma_variants(tried, 32)
    assert wide[:2] == out and dataclasses.replace(eight, tma=True) in wide
    assert dataclasses.replace(capped, tma=True) in wide and len(wide) == len(set(wide))


def test_precompile_covers_the_tma_binaries(sweep):
    shapes = {(N, K) for _, N, K in sweep.MODELS[0].projections()}
    problems = [p for p in sweep.compile_problems(False, sweep.MODELS[:1], (1, 32)) if p[:2] in shapes]
    gemm = {(N, K, M, c) for N, K, M, c in problems if c.path is KernelPath.GEMM and not c.tma}
    tma = {(N, K, M, dataclasses.replace(c, tma=False)) for N, K, M, c in problems if c.tma}
    assert gemm and tma == gemm  # every GEMM binary of the sweep, with TMA too
    quick = sweep.compile_problems(True, sweep.MODELS[:1], (1, 32))  # no phase 4: TMA only where a default has it
    assert all(dataclasses.replace(c, ptx_decode=True) in sweep.default_configs(M) for _, _, M, c in quick if c.tma)


def test_tma_x_variants_take_the_fastest_gemm_configs_from_16_rows(sweep):
    tma = LaunchConfig(KernelPath.GEMM, 64, 256, num_stages=3, split_k=3, tma=True)
    wide = LaunchConfig(KernelPath.GEMM, 64, 512, num_stages=2)  # a K step no TMA box of x holds
    tried = [timed(LaunchConfig(KernelPath.GEMV, 4, 1024), 1.0), timed(wide, 2.0), timed(tma, 10.0),
             timed(LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=4), 12.0),
             timed(LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3), 30.0),
             timed(LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=3), 40.0)]
    out = sweep.tma_x_variants(tried, 32)
    assert out == [dataclasses.replace(tma, tma_x=True), LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=4, tma_x=True),
                   LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3, tma_x=True)]
    assert sweep.tma_x_variants(tried, 8) == []  # below TMA_X_MIN_M
    assert sweep.tma_x_variants([timed(out[0], 1.0)], 32) == []  # tma_x configs are not varied again


def test_tma_final_variants_give_weight_tma_to_the_fastest_configs_still_without_it(sweep):
    won = LaunchConfig(KernelPath.GEMM, 64, 256, num_stages=3, gather_t=True, resident=3, tma_x=True)  # phase 5's
    both = LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=3, tma=True, tma_x=True)
    plain = LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3)
    tried = [timed(LaunchConfig(KernelPath.GEMV, 4, 1024), 1.0), timed(won, 10.0), timed(both, 11.0),
             timed(plain, 12.0), timed(LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=4), 13.0)]
    out = sweep.tma_final_variants(tried)
    assert out == [dataclasses.replace(won, tma=True), dataclasses.replace(plain, tma=True)]
    assert sweep.tma_final_variants(tried + [timed(out[0], 11.5)]) == [out[1]]  # a twin timed already is not again
    problems = sweep.compile_problems(False, sweep.MODELS[:1], (32,))
    assert (4096, 4096, 32, out[0]) in problems  # phase 5's binaries cover them


def test_precompile_covers_the_tma_x_binaries(sweep):
    shapes = {(N, K) for _, N, K in sweep.MODELS[0].projections()}
    problems = [p for p in sweep.compile_problems(False, sweep.MODELS[:1], (1, 32)) if p[:2] in shapes]
    gemm = {(N, K, M, c) for N, K, M, c in problems if c.path is KernelPath.GEMM and not c.tma_x}
    tma_x = {(N, K, M, dataclasses.replace(c, tma_x=False)) for N, K, M, c in problems if c.tma_x}
    assert tma_x == {(N, K, M, c) for N, K, M, c in gemm if M == 32 and c.block_k <= 256}  # from 16 rows only
    assert not any(c.tma_x for _, _, _, c in sweep.compile_problems(True, sweep.MODELS[:1], (1, 32)))


def run(commit: str, rows: list[tuple[int, LaunchConfig, bool]]) -> dict:
    timings = [{"N": 64, "K": 128, "M": M, "w12": {"tried": [timed(cfg, 1.0)], "best_config": cfg.label(), "swept": swept}}
               for M, cfg, swept in rows]
    return {"meta": {"gpu": "NVIDIA H200", "git_commit": commit}, "timings": timings}


def test_merge_tuned_keeps_the_older_run_where_the_newer_did_not_sweep(sweep):
    a, b, c = (LaunchConfig(KernelPath.GEMM, 64, k, num_stages=3) for k in (128, 256, 512))
    old = run("old", [(1, a, True), (32, a, True)])
    new = run("new", [(1, b, False), (32, c, True), (64, b, False)])
    table = sweep.merge_tuned(new, old)
    got = {e["m"]: LaunchConfig.from_dict(e["config"]) for e in table["entries"]}
    assert got == {1: a, 32: c, 64: b}  # 1: the new run only timed defaults; 64: nothing older to keep
    assert table["merged_from"] == ["new", "old"] and {e["format"] for e in table["entries"]} == {"w12"}


def test_merge_tuned_into_a_tuned_table_keeps_its_other_rows(sweep):
    """OLD may be a tuned table (the shipped one): a run of some row counts replaces only the rows it swept."""
    a, b, c = (LaunchConfig(KernelPath.GEMM, 64, k, num_stages=3) for k in (128, 256, 512))
    shipped = sweep.merge_tuned(run("x", [(1, a, True), (32, a, True)]), run("y", [(64, c, True)]))
    new = run("new", [(1, b, True), (2, b, False)])
    table = sweep.merge_tuned(new, shipped)
    got = {e["m"]: LaunchConfig.from_dict(e["config"]) for e in table["entries"]}
    assert got == {1: b, 2: b, 32: a, 64: c}
    assert table["merged_from"] == ["new", "x", "y"]


def test_merge_tuned_command_writes_a_table_the_kernels_read(sweep, tmp_path, monkeypatch):
    import json

    from specpilot.kernels import configs

    a, b = (LaunchConfig(KernelPath.GEMM, 64, k, num_stages=3) for k in (128, 256))
    (tmp_path / "new.json").write_text(json.dumps(run("new", [(32, b, True)])))
    (tmp_path / "old.json").write_text(json.dumps(run("old", [(1, a, True), (32, a, True)])))
    assert sweep.main(["--merge-tuned", str(tmp_path / "new.json"), str(tmp_path / "old.json"), "--out", str(tmp_path)]) == 0
    (tmp_path / "tuned").mkdir()
    (tmp_path / "tuned_nvidia_h200.json").rename(tmp_path / "tuned" / "nvidia_h200.json")  # as run_on_gpu.sh copies it
    monkeypatch.setattr(configs, "TUNED_DIR", tmp_path / "tuned")
    configs.tuned_table.cache_clear()
    try:
        assert configs.choose_config(WeightFormat.W12, 32, 64, 128, "NVIDIA H200") == b
        assert configs.choose_config(WeightFormat.W12, 1, 64, 128, "NVIDIA H200") == a
    finally:
        configs.tuned_table.cache_clear()


def test_split_variants_give_near_best_configs_a_split_that_fits_one_wave(sweep):
    """Qwen3-32B down (5120 x 25600): 40 row tiles of n128 split 7 ways automatically = 280
    programs for 264 slots on 132 SMs; the variant splits 6 ways. The n64 tiles (80 x 4 = 320
    programs) overshoot too and get 3; a config with an explicit split or far from the fastest
    gets none."""
    n64 = LaunchConfig(KernelPath.GEMM, 64, 256, num_stages=2, resident=3)
    n128 = LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3)
    slow = LaunchConfig(KernelPath.GEMM, 128, 256, num_warps=8, num_stages=2)
    fixed = LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=3, split_k=4)
    assert sweep.one_wave_split(n128, 5120, 25600, 132) == LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8,
                                                                         num_stages=3, split_k=6)
    assert sweep.one_wave_split(fixed, 5120, 25600, 132) is None
    assert sweep.one_wave_split(n64, 51200, 5120, 132) is None  # 800 row tiles: no split, one program each
    tried = [timed(n64, 64.0), timed(n128, 80.0), timed(slow, 90.0), timed(fixed, 66.0)]
    out = sweep.split_variants(tried, 5120, 25600, 132)
    assert sweep.dataclasses.replace(n128, split_k=6) in out
    assert sweep.dataclasses.replace(n64, split_k=3) in out
    assert not any(c.block_n == 128 and c.block_k == 256 and c.split_k for c in out)  # 90 > 1.3 x 64
    assert len(out) == len(set(out))


def test_ms_takes_only_the_swept_row_counts(sweep, capsys):
    with pytest.raises(SystemExit):
        sweep.main(["--out", "/dev/null", "--ms", "3"])
    assert "--ms takes row counts of [1, 2, 4, 8, 16, 32, 64], got [3]" in capsys.readouterr().err


def test_a_shipped_run_takes_any_row_count_the_dispatcher_serves(sweep, capsys):
    """Between the buckets' bounds the dispatcher runs the bucket's config (tuned at the bound
    only): --shipped times those row counts too, after the targets; a sweep keeps the bounds."""
    assert sweep.row_counts([24, 32, 17, 1], False, True) == (1, 32, 17, 24)
    assert sweep.row_counts(None, False, True) == sweep.M_ORDER
    with pytest.raises(ValueError, match=r"--ms takes row counts of \[1, 2, 4, 8, 16, 32, 64\], got \[24\]"):
        sweep.row_counts([24, 32], False, False)
    for bad in ("65", "0"):
        with pytest.raises(SystemExit) as err:
            sweep.main(["--out", "/dev/null", "--shipped", "--ms", bad])
        assert err.value.code == 2
        assert f"--ms takes row counts of 1-64 with --shipped, got [{bad}]" in capsys.readouterr().err


def test_one_wave_split_leaves_a_config_that_already_rounds_down(sweep):
    fw = LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3, fit_wave=True)
    assert sweep.one_wave_split(fw, 5120, 25600, 132) is None


def test_explicit_splits_of_the_rounding_heuristic_tile_are_valid_configs(sweep):
    """The e15ad5c sweep lost five row groups to this: the heuristic 8-warp tile (fit_wave) was the
    fastest of phase 1 on a shape with few row tiles, and its explicit-split variants kept
    fit_wave, which LaunchConfig rejects beside split_k."""
    fw = LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3, fit_wave=True)
    out = sweep.split_variants([timed(fw, 30.0)], 10240, 5120, 132)  # Qwen3-32B qkv: 80 row tiles
    assert [c.split_k for c in out if c.split_k] == list(sweep.EXPLICIT_SPLITS)
    assert not any(c.fit_wave for c in out if c.split_k)


def test_rotated_rounds_times_every_arm_once_per_round_in_rotated_order(sweep, monkeypatch):
    order = []
    speeds = {"a": [3.0, 2.0, 4.0], "b": [5.0, 6.0, 1.5], "c": [7.0, 7.0, 7.0]}
    monkeypatch.setattr(sweep, "warm_clocks", lambda: order.append("warm"))
    monkeypatch.setattr(sweep, "graph_time_us", lambda calls: (order.append(calls[0]), speeds[calls[0]].pop(0))[1])
    best, runs = sweep.rotated_rounds({"a": ["a"], "b": ["b"], "c": ["c"]})
    assert order == ["warm", "a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert best == {"a": 2.0, "b": 1.5, "c": 7.0}
    assert runs == {"a": [3.0, 2.0, 4.0], "b": [5.0, 6.0, 1.5], "c": [7.0, 7.0, 7.0]}


def test_quick_and_shipped_are_refused_together(sweep, capsys):
    with pytest.raises(SystemExit):
        sweep.main(["--out", "/dev/null", "--quick", "--shipped"])
    assert "--quick and --shipped are different runs" in capsys.readouterr().err


def test_shipped_precompiles_the_dispatchers_configs_and_the_heuristics_only(sweep, monkeypatch):
    tuned = LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=3, split_k=4, tma=True)
    monkeypatch.setattr(sweep, "shipped_config", lambda fmt, M, N, K: tuned if fmt is WeightFormat.W12 else
                        sweep.kc.heuristic_config(M, fmt, N, K))
    problems = sweep.compile_problems(False, sweep.MODELS[:1], (32,), shipped=True)
    timed = {cfg for N, K, M, cfg in problems if M == 32}  # the correctness cases use other row counts
    heuristics = {sweep.kc.heuristic_config(32, f, N, K) for f in WeightFormat for _, N, K in sweep.QWEN3_8B.projections()}
    assert timed == heuristics | {tuned}  # no sweep candidates, no phase variants


def test_a_shipped_run_writes_no_tuned_table(sweep, tmp_path):
    results = sweep.Results(tmp_path, {"gpu": "NVIDIA H200"}, write_tuned=False)
    results.best[("w12", 1, 64, 64)] = LaunchConfig(KernelPath.GEMM, 64, 128)
    results.save()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w12_kernels.json", "w12_kernels.md"]
    sweep.Results(tmp_path, {"gpu": "NVIDIA H200"}).save()
    assert (tmp_path / "tuned_nvidia_h200.json").is_file()


def test_a_shipped_run_names_the_table_it_times(sweep):
    entries = len(sweep.kc.tuned_table("nvidia_h200"))
    assert entries > 0  # the H200 table ships with the package
    assert sweep.shipped_table("NVIDIA H200") == f"specpilot/kernels/tuned/nvidia_h200.json ({entries} entries)"
    assert sweep.shipped_table("Some GPU") == "none for 'Some GPU': every row runs the heuristic config"
