"""scripts/w12_kernels.py (the GPU benchmark driver) without a GPU: what it precompiles, its flags,
and the files it writes. The search it runs is tested in tests/kernels/test_search.py."""

import dataclasses

import pytest

from specpilot.kernels import configs as kc
from specpilot.kernels import search
from specpilot.kernels.configs import KernelPath, LaunchConfig, WeightFormat


@pytest.fixture(scope="module")
def sweep(bench_script):
    return bench_script("w12_kernels")


def test_precompile_covers_the_binaries_of_every_phase_of_the_search(sweep):
    problems = sweep.compile_problems(False, sweep.MODELS[:1], (1, 32))
    for _, N, K in sweep.QWEN3_8B.projections():
        assert {(N, K, 32, c) for c in search.sweep_binaries(32)} <= set(problems)
    assert any(c.gather_t and M == 32 for _, _, M, c in problems)
    assert not any(c.gather_t and M == 1 for _, _, M, c in problems)


def test_precompile_covers_the_tma_binaries(sweep):
    shapes = {(N, K) for _, N, K in sweep.MODELS[0].projections()}
    problems = [p for p in sweep.compile_problems(False, sweep.MODELS[:1], (1, 32)) if p[:2] in shapes]
    gemm = {(N, K, M, c) for N, K, M, c in problems if c.path is KernelPath.GEMM and not c.tma}
    tma = {(N, K, M, dataclasses.replace(c, tma=False)) for N, K, M, c in problems if c.tma}
    assert gemm and tma == gemm  # every GEMM binary of the sweep, with TMA too
    quick = sweep.compile_problems(True, sweep.MODELS[:1], (1, 32))  # no phase 4: TMA only where a default has it
    assert all(dataclasses.replace(c, ptx_decode=True) in search.default_configs(M) for _, _, M, c in quick if c.tma)


def test_precompile_covers_the_tma_x_binaries(sweep):
    shapes = {(N, K) for _, N, K in sweep.MODELS[0].projections()}
    problems = [p for p in sweep.compile_problems(False, sweep.MODELS[:1], (1, 32)) if p[:2] in shapes]
    gemm = {(N, K, M, c) for N, K, M, c in problems if c.path is KernelPath.GEMM and not c.tma_x}
    tma_x = {(N, K, M, dataclasses.replace(c, tma_x=False)) for N, K, M, c in problems if c.tma_x}
    assert tma_x == {(N, K, M, c) for N, K, M, c in gemm if M == 32 and c.block_k <= 256}  # from 16 rows only
    assert not any(c.tma_x for _, _, _, c in sweep.compile_problems(True, sweep.MODELS[:1], (1, 32)))


def run(commit: str, rows: list[tuple[int, LaunchConfig, bool]]) -> dict:
    """A w12_kernels.json of one W12 [64, 128] projection whose search found `cfg` at each M."""
    timings = []
    for M, cfg, swept in rows:
        found = search.SearchResult(search.Problem(WeightFormat.W12, 64, 128, M), (search.Trial(cfg, us=1.0),), swept, cfg,
                                    search.Trial(cfg, us=1.0))
        timings.append({"N": 64, "K": 128, "M": M, "w12": found.to_dict()})
    return {"meta": {"gpu": "NVIDIA H200", "git_commit": commit}, "timings": timings}


def test_merge_tuned_command_writes_a_table_the_kernels_read(sweep, tmp_path, monkeypatch):
    import json

    from specpilot.kernels import configs

    a, b = (LaunchConfig(KernelPath.GEMM, 64, k, num_stages=3) for k in (128, 256))
    (tmp_path / "new.json").write_text(json.dumps(run("new", [(32, b, True)])))
    (tmp_path / "old.json").write_text(json.dumps(run("old", [(1, a, True), (32, a, True)])))
    assert sweep.main(["--merge-tuned", str(tmp_path / "new.json"), str(tmp_path / "old.json"), "--out", str(tmp_path)]) == 0
    (tmp_path / "tuned").mkdir()
    (tmp_path / "tuned_nvidia_h200.json").rename(tmp_path / "tuned" / "nvidia_h200.json")  # where the dispatcher reads it
    monkeypatch.setattr(configs, "TUNED_DIR", tmp_path / "tuned")
    configs.tuned_table.cache_clear()
    try:
        assert configs.choose_config(WeightFormat.W12, 32, 64, 128, "NVIDIA H200") == b
        assert configs.choose_config(WeightFormat.W12, 1, 64, 128, "NVIDIA H200") == a
    finally:
        configs.tuned_table.cache_clear()


def test_ms_takes_only_the_swept_row_counts(sweep, capsys):
    with pytest.raises(SystemExit):
        sweep.main(["--out", "/dev/null", "--ms", "3"])
    assert "--ms takes row counts of [1, 2, 4, 8, 16, 32, 64, 128], got [3]" in capsys.readouterr().err


def test_a_shipped_run_takes_any_row_count_the_dispatcher_serves(sweep, capsys):
    """Between the buckets' bounds the dispatcher runs the bucket's config (tuned at the bound
    only): --shipped times those row counts too, after the targets; a sweep keeps the bounds."""
    assert sweep.row_counts([24, 32, 17, 1], False, True) == (1, 32, 17, 24)
    assert sweep.row_counts(None, False, True) == sweep.M_ORDER
    with pytest.raises(ValueError, match=r"--ms takes row counts of \[1, 2, 4, 8, 16, 32, 64, 128\], got \[24\]"):
        sweep.row_counts([24, 32], False, False)
    for bad in ("129", "0"):
        with pytest.raises(SystemExit) as err:
            sweep.main(["--out", "/dev/null", "--shipped", "--ms", bad])
        assert err.value.code == 2
        assert f"--ms takes row counts of 1-128 with --shipped, got [{bad}]" in capsys.readouterr().err


def test_quick_and_shipped_are_refused_together(sweep, capsys):
    with pytest.raises(SystemExit):
        sweep.main(["--out", "/dev/null", "--quick", "--shipped"])
    assert "--quick and --shipped are different runs" in capsys.readouterr().err


def test_shipped_precompiles_the_dispatchers_configs_and_the_heuristics_only(sweep, monkeypatch):
    tuned = LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=3, split_k=4, tma=True)
    monkeypatch.setattr(sweep, "shipped_config", lambda fmt, M, N, K: tuned if fmt is WeightFormat.W12 else
                        kc.heuristic_config(M, fmt, N, K))
    problems = sweep.compile_problems(False, sweep.MODELS[:1], (32,), shipped=True)
    timed = {cfg for N, K, M, cfg in problems if M == 32}  # the correctness cases use other row counts
    heuristics = {kc.heuristic_config(32, f, N, K) for f in WeightFormat for _, N, K in sweep.QWEN3_8B.projections()}
    assert timed == heuristics | {tuned}  # no sweep candidates, no phase variants


def test_a_shipped_run_writes_no_tuned_table(sweep, tmp_path):
    results = sweep.Results(tmp_path, {"gpu": "NVIDIA H200"}, write_tuned=False)
    results.best[("w12", 1, 64, 64)] = LaunchConfig(KernelPath.GEMM, 64, 128)
    results.save()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w12_kernels.json", "w12_kernels.md"]
    sweep.Results(tmp_path, {"gpu": "NVIDIA H200"}).save()
    assert (tmp_path / "tuned_nvidia_h200.json").is_file()


def test_a_shipped_run_names_the_table_it_times(sweep):
    entries = len(kc.tuned_table("nvidia_h200"))
    assert entries > 0  # the H200 table ships with the package
    assert sweep.shipped_table("NVIDIA H200") == f"specpilot/kernels/tuned/nvidia_h200.json ({entries} entries)"
    assert sweep.shipped_table("Some GPU") == "none for 'Some GPU': every row runs the heuristic config"

