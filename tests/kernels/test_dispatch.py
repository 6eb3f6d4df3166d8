"""Dispatch by M, config choice, and the modules the engine swaps in (TritonLinear, W12Linear)."""

import dataclasses
import json

import pytest
import torch
import torch.nn as nn

from specpilot.errors import ConfigError
from specpilot.kernels import configs, linear
from specpilot.models.linear import TritonLinear, swap_projections
from specpilot.kernels.configs import (
    KernelPath,
    LaunchConfig,
    WeightFormat,
    auto_split_k,
    choose_config,
)
from specpilot.models.random_checkpoint import random_model, tiny_config
from specpilot.models.w12_linear import W12Linear
from specpilot.w12 import encode

# numpy (the interpreter) warns when 0 * Inf makes a NaN, which these tests do on purpose
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture(scope="module")
def weight(make_weight):
    return make_weight(37, 300)


def test_heuristic_picks_tensor_cores_for_every_row_count():
    for fmt, M in ((WeightFormat.W12, 1), (WeightFormat.W12, 2), (WeightFormat.DENSE, 5), (WeightFormat.W12, 64)):
        assert choose_config(fmt, M, 4096, 4096).path is KernelPath.GEMM


def test_every_candidate_fits_shared_memory_at_its_rows():
    for M in range(1, configs.GEMM_MAX_M + 1):
        for cfg in configs.candidates(M):
            assert cfg.shared_bytes(M, 2.0) <= configs.SHARED_MEMORY_BUDGET
    assert configs.gemm_candidates(64) != configs.gemm_candidates(1)  # the deepest buffers drop out at M = 64


def test_tuned_table_overrides_the_heuristic(tmp_path, monkeypatch):
    pinned = LaunchConfig(KernelPath.GEMM, block_n=128, block_k=128, split_k=2, num_warps=8)
    table = {"entries": [{"format": "w12", "m": 2, "n": 4096, "k": 4096, "config": pinned.to_dict()}]}
    (tmp_path / "nvidia_h200.json").write_text(json.dumps(table))
    monkeypatch.setattr(configs, "TUNED_DIR", tmp_path)
    configs.tuned_table.cache_clear()
    try:
        assert choose_config(WeightFormat.W12, 2, 4096, 4096, "NVIDIA H200") == pinned
        assert choose_config(WeightFormat.W12, 2, 4096, 4096, "NVIDIA H100") != pinned  # other device
        assert choose_config(WeightFormat.DENSE, 2, 4096, 4096, "NVIDIA H200") != pinned  # other format
    finally:
        configs.tuned_table.cache_clear()


def test_a_table_for_other_kernels_is_a_clear_error(tmp_path, monkeypatch):
    stale = {"path": "gemm", "block_n": 64, "block_k": 128, "prefetch": True}  # a field these kernels lack
    (tmp_path / "nvidia_h200.json").write_text(json.dumps({"entries": [{"format": "w12", "m": 1, "n": 64, "k": 128,
                                                                        "config": stale}]}))
    monkeypatch.setattr(configs, "TUNED_DIR", tmp_path)
    configs.tuned_table.cache_clear()
    try:
        with pytest.raises(ConfigError, match="not a tuned-config table"):
            choose_config(WeightFormat.W12, 1, 64, 128, "NVIDIA H200")
    finally:
        configs.tuned_table.cache_clear()


def test_auto_split_fills_the_gpu_only_when_row_tiles_are_few():
    assert auto_split_k(n_tiles=1024, k_steps=16, sm_count=132) == 1
    assert auto_split_k(n_tiles=64, k_steps=16, sm_count=132) == 5
    assert auto_split_k(n_tiles=64, k_steps=3, sm_count=132) == 1  # each split keeps >= 2 steps
    assert auto_split_k(n_tiles=1, k_steps=1000, sm_count=132) == configs.MAX_SPLIT_K
    assert auto_split_k(n_tiles=64, k_steps=16, sm_count=132, programs_per_sm=1) == 3
    assert auto_split_k(n_tiles=300, k_steps=16, sm_count=132, programs_per_sm=4) == 2


def test_fit_wave_rounds_the_split_down_to_one_wave():
    """Qwen3-32B down in n128 tiles: 40 row tiles, 200 K steps of 128. Rounded up, 7 splits make
    280 programs for the 264 that fit two per SM; rounded down, 6 make 240. The 8-warp heuristic
    tile (exactly two per SM) rounds down; the 4-warp ones, which fit more, do not."""
    from specpilot.kernels.configs import heuristic_config

    assert auto_split_k(n_tiles=40, k_steps=200, sm_count=132) == 7
    assert auto_split_k(n_tiles=40, k_steps=200, sm_count=132, fit_wave=True) == 6
    assert auto_split_k(n_tiles=192, k_steps=32, sm_count=132, fit_wave=True) == 1  # 8B gate_up: one per tile
    assert auto_split_k(n_tiles=1024, k_steps=16, sm_count=132, fit_wave=True) == 1
    assert heuristic_config(64, WeightFormat.W12, 5120, 25600).fit_wave
    assert "fw" in heuristic_config(64, WeightFormat.W12, 5120, 25600).label().split()
    assert not heuristic_config(32, WeightFormat.W12, 5120, 25600).fit_wave
    assert not heuristic_config(64, WeightFormat.DENSE, 5120, 25600).fit_wave
    with pytest.raises(ValueError, match="fit_wave"):
        LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, split_k=3, fit_wave=True)


@pytest.mark.parametrize("rows", [1, 6, 65])  # GEMM, GEMM, decode + F.linear (heuristic configs)
def test_linear_dispatches_by_rows(weight, make_x, to_device, check, rows):
    for w in map(to_device, (encode(weight), weight)):
        x = make_x(rows, 300)
        y = linear(x.reshape(rows, 1, 300), w)
        assert y.shape == (rows, 1, 37)
        check(y.reshape(rows, 37), x, w)
    assert linear(make_x(1, 300)[:0], to_device(weight)).shape == (0, 37)


@pytest.mark.parametrize("config", [configs.LaunchConfig(configs.KernelPath.GEMV, block_n=8, block_k=128),
                                    configs.LaunchConfig(configs.KernelPath.GEMM, block_n=16, block_k=128)],
                         ids=lambda c: c.label())
@pytest.mark.slow
def test_run_config_runs_the_configs_own_path_with_its_escape_option(weight, make_x, to_device, config):
    """`run_config` launches a GEMV config on the GEMV and a GEMM config on the GEMM, passing
    `escapes` through: bit for bit the path's own call, with and without the escapes."""
    from specpilot.kernels.dispatch import run_config
    from specpilot.kernels.gemm import gemm
    from specpilot.kernels.gemv import gemv

    own = gemv if config.path is configs.KernelPath.GEMV else gemm
    w, x = to_device(encode(weight)), make_x(2, 300)
    for escapes in ("auto", "off"):
        assert torch.equal(run_config(x, w, config, escapes=escapes).view(torch.int32),
                           own(x, w, config, escapes=escapes).view(torch.int32)), escapes
    assert not torch.equal(run_config(x, w, config), run_config(x, w, config, escapes="off"))  # escapes count


def test_modules_run_the_kernels(weight, make_x, device, check):
    lin = nn.Linear(300, 37, bias=False)
    with torch.no_grad():
        lin.weight.copy_(weight.float())
    x = make_x(4, 300)
    for module in (TritonLinear.from_linear(lin), W12Linear.from_linear(lin)):
        y = module.to(device)(x.reshape(2, 2, 300))
        assert y.shape == (2, 2, 37)
        check(y.reshape(4, 37), x, weight.float())


def bf16_exact_model():
    model = random_model(tiny_config(num_layers=2), seed=0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())
    return model.eval()


@pytest.mark.parametrize("w12", [False, True])
@pytest.mark.slow
def test_swap_projections(device, w12):
    model = bf16_exact_model()
    tokens = torch.randint(0, 4096, (1, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model.forward_causal(tokens)
    assert swap_projections(model, w12=w12, lm_head=True) == 2 * 4 + 1
    kind = W12Linear if w12 else TritonLinear
    assert isinstance(model.layers[1].mlp.down_proj, kind) and isinstance(model.lm_head, kind)
    with torch.no_grad():
        got = model.to(device).forward_causal(tokens.to(device)).cpu()
    # Each projection is bounded by the kernel tests; this checks the wiring (a wrong or transposed
    # weight, or a lost escape, moves logits by O(1)), allowing float32 re-association through the model.
    assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()


def test_w12_swap_refuses_weights_that_are_not_bf16():
    model = random_model(tiny_config(num_layers=1), seed=0)  # float32 weights
    with pytest.raises(ConfigError, match="BF16"):
        swap_projections(model, w12=True)


def test_heuristic_tiles_follow_the_format_and_row_bucket():
    from specpilot.kernels.configs import heuristic_config

    tile = lambda c: (c.block_n, c.block_k, c.num_warps, c.num_stages)  # noqa: E731
    assert [tile(heuristic_config(M)) for M in (1, 16, 17, 32, 33, 64)] == [
        (64, 256, 4, 3), (64, 256, 4, 3), (64, 128, 4, 3), (64, 128, 4, 3), (128, 128, 8, 3), (128, 128, 8, 3)]
    assert {tile(heuristic_config(M, WeightFormat.DENSE)) for M in (1, 32, 64)} == {(64, 128, 4, 3)}
    for fmt in WeightFormat:  # every heuristic's tile is a candidate the sweep times (so reports can compare it)
        for M in range(1, configs.GEMM_MAX_M + 1):
            h = heuristic_config(M, fmt)
            assert h.path is not KernelPath.GEMM or h.tma  # weight tiles by TMA where the GPU has it
            assert dataclasses.replace(h, fit_wave=False, tma=False) in configs.candidates(M)
    assert choose_config(WeightFormat.DENSE, 32, 4096, 4096) == heuristic_config(32, WeightFormat.DENSE)


def test_heuristic_gathers_from_transposed_x_on_large_w12_weights_at_many_rows():
    from specpilot.kernels.configs import heuristic_config

    lm_head = (151936, 4096)
    assert heuristic_config(32, WeightFormat.W12, *lm_head).gather_t
    assert heuristic_config(64, WeightFormat.W12, *lm_head).gather_t
    assert not heuristic_config(16, WeightFormat.W12, *lm_head).gather_t  # the copy costs more than it saves
    assert not heuristic_config(32, WeightFormat.W12, 4096, 12288).gather_t  # a small weight
    assert not heuristic_config(32, WeightFormat.DENSE, *lm_head).gather_t  # plain weights have no escapes
    assert not heuristic_config(32).gather_t  # size unknown


@pytest.fixture
def unpack_table(tmp_path, monkeypatch):
    """A shipped table whose (w12, 4, 37, 300) row says decode then cuBLAS, read for every device."""
    from specpilot.kernels import dispatch
    from specpilot.kernels.search import tuned_document

    doc = tuned_document("NVIDIA H200", {("w12", 4, 37, 300): configs.Fallback.UNPACK_CUBLAS})
    (tmp_path / "nvidia_h200.json").write_text(json.dumps(doc))
    monkeypatch.setattr(configs, "TUNED_DIR", tmp_path)
    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(dispatch, "device_name", lambda device: "NVIDIA H200")  # CPU: no GPU name to key by
    configs.tuned_table.cache_clear()
    yield doc
    configs.tuned_table.cache_clear()


def launched_kernels(monkeypatch) -> list:
    """The launch configs `dispatch.linear` runs from now on (recorded, then run)."""
    from specpilot.kernels import dispatch

    runs, run = [], dispatch.run_config
    monkeypatch.setattr(dispatch, "run_config",
                        lambda x, w, config, **kw: runs.append(config) or run(x, w, config, **kw))
    return runs


@pytest.mark.parametrize("rows,path", [(4, configs.Fallback.UNPACK_CUBLAS),  # the table's row
                                       (65, configs.Fallback.DECODED_CUBLAS)])  # above 64 rows, the rule
def test_decode_then_cublas_is_bit_exact_where_the_table_or_the_rule_picks_it(
        weight, make_x, to_device, unpack_table, monkeypatch, rows, path):
    """W12 decoded (into the shared buffer, or the kept copy) then F.linear equals decode + F.linear
    bit for bit, for `linear` and for a W12Linear module, and launches no GEMV/GEMM."""
    from specpilot.w12 import decode

    runs = launched_kernels(monkeypatch)
    w12 = to_device(encode(weight))
    x = make_x(rows, 300)
    expected = torch.nn.functional.linear(x, decode(w12).to(x.dtype))
    assert configs.choose(WeightFormat.W12, rows, 37, 300, "NVIDIA H200") is path
    assert torch.equal(linear(x, w12).view(torch.int32), expected.view(torch.int32))
    module = W12Linear(w12, table="")
    assert torch.equal(module(x).view(torch.int32), expected.view(torch.int32))
    assert runs == []


def test_rows_the_table_does_not_cover_run_the_kernels(weight, make_x, to_device, check, unpack_table, monkeypatch):
    runs = launched_kernels(monkeypatch)
    w12, x = to_device(encode(weight)), make_x(2, 300)  # bucket 2: no row, the heuristic GEMM
    check(linear(x, w12), x, w12)
    assert runs == [configs.heuristic_config(2, WeightFormat.W12, 37, 300)]
    assert configs.choose(WeightFormat.DENSE, 4, 37, 300, "NVIDIA H200") == configs.heuristic_config(
        4, WeightFormat.DENSE, 37, 300)  # the row is W12's


def test_a_tuned_config_runs_the_kernels_up_to_their_row_limit_and_not_above(tmp_path, monkeypatch):
    """Above RULE_MAX_M rows an untuned shape runs cuBLAS on the kept decoded weight; a tuned config
    there takes the kernels (a 65-128 row verify tree, where the search timed them faster), up to
    GEMM_MAX_M."""
    pinned = LaunchConfig(KernelPath.GEMM, block_n=64, block_k=128)
    from specpilot.kernels.search import tuned_document

    doc = tuned_document("x", {("w12", 128, 37, 300): pinned, ("w12", 256, 37, 300): pinned})
    (tmp_path / "nvidia_h200.json").write_text(json.dumps(doc))
    monkeypatch.setattr(configs, "TUNED_DIR", tmp_path)
    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    configs.tuned_table.cache_clear()
    try:
        assert configs.choose(WeightFormat.W12, 100, 37, 300, "NVIDIA H200") == pinned
        assert configs.choose(WeightFormat.W12, 100, 37, 301, "NVIDIA H200") is configs.Fallback.DECODED_CUBLAS
        assert configs.choose(WeightFormat.W12, 200, 37, 300, "NVIDIA H200") is configs.Fallback.DECODED_CUBLAS
        assert configs.choose(WeightFormat.DENSE, 200, 37, 300, "NVIDIA H200") is configs.Fallback.UNPACK_CUBLAS
    finally:
        configs.tuned_table.cache_clear()


def test_a_decoded_cublas_entry_decodes_once_and_keeps_the_copy_while_the_weight_lives(
        weight, make_x, to_device, tmp_path, monkeypatch):
    import gc

    from specpilot.kernels import dispatch
    from specpilot.kernels.search import tuned_document
    from specpilot.w12 import decode

    doc = tuned_document("NVIDIA H200", {("w12", 4, 37, 300): configs.Fallback.DECODED_CUBLAS})
    (tmp_path / "nvidia_h200.json").write_text(json.dumps(doc))
    monkeypatch.setattr(configs, "TUNED_DIR", tmp_path)
    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(dispatch, "device_name", lambda device: "NVIDIA H200")
    configs.tuned_table.cache_clear()
    runs = launched_kernels(monkeypatch)
    try:
        w12, x = to_device(encode(weight)), make_x(3, 300)
        expected = torch.nn.functional.linear(x, decode(w12).to(x.dtype))
        for _ in range(2):
            assert torch.equal(linear(x, w12).view(torch.int32), expected.view(torch.int32))
        assert runs == [] and dispatch.decoded(w12) is dispatch.decoded(w12)
        key = id(w12)
        assert key in dispatch._decoded
        del w12
        gc.collect()
        assert key not in dispatch._decoded  # dropped with the weight
    finally:
        configs.tuned_table.cache_clear()


def test_a_weight_whose_copy_would_not_fit_decodes_at_each_call_with_the_same_values(
        weight, make_x, to_device, monkeypatch):
    """Where a kept BF16 copy would leave less than DECODED_RESERVE of the GPU free, the weight is
    decoded into the shared buffer at each call instead: no copy is kept, the output is the same."""
    from specpilot.kernels import dispatch
    from specpilot.w12 import decode

    w12, x = to_device(encode(weight)), make_x(3, 300)
    expected = torch.nn.functional.linear(x, decode(w12).to(x.dtype))
    monkeypatch.setattr(dispatch, "room_for_copy", lambda w: False)
    y = dispatch.run_fallback(x, w12, configs.Fallback.DECODED_CUBLAS)
    assert torch.equal(y.view(torch.int32), expected.view(torch.int32))
    assert dispatch._decoded[id(w12)] is None  # decided once for this weight
    from specpilot.kernels.workspace import unpack_buffer

    assert dispatch.decoded(w12).data_ptr() == unpack_buffer(w12.device, *w12.shape).data_ptr()  # the shared one


def test_room_for_a_copy_leaves_the_reserve_free_on_a_gpu(monkeypatch):
    """A copy fits where free memory (with what the caching allocator holds unused) less its BF16
    bytes stays at or above DECODED_RESERVE of the device."""
    from specpilot.kernels import dispatch

    class Fake:  # a [N, K] W12 weight on a GPU, 2 GiB as BF16
        device, shape = torch.device("cuda", 0), (1 << 15, 1 << 15)

    gib, total = 1 << 30, 80 << 30
    for free, cached, fits in [(12 * gib, 0, True), (9 * gib, 0, False), (6 * gib, 4 * gib, True)]:
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, f=free: (f, total))
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device, c=cached: 10 * gib + c)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 10 * gib)
        assert dispatch.room_for_copy(Fake()) is fits


def test_a_prefill_takes_the_kept_copy_and_other_calls_the_kernels(weight, make_x, to_device, check, monkeypatch):
    """Once a W12 weight's decoded copy is kept (a call above the rule's rows made it), calls in a
    prefill scope at kernel row counts run cuBLAS on it, bit-exact with decode + F.linear; outside
    the scope (a step's warm-up before its capture) and while a CUDA graph is captured the kernels
    run; a weight without a copy gets none made for it."""
    from specpilot.kernels import dispatch
    from specpilot.w12 import decode

    runs = launched_kernels(monkeypatch)
    w12, x = to_device(encode(weight)), make_x(2, 300)
    with dispatch.prefill_scope():
        check(linear(x, w12), x, w12)
    assert len(runs) == 1 and not dispatch.kept_copy(w12)  # no copy yet: the kernels, and none is made
    linear(make_x(65, 300), w12)  # above RULE_MAX_M rows: the rule keeps a decoded copy
    assert dispatch.kept_copy(w12) and len(runs) == 1
    expected = torch.nn.functional.linear(x, decode(w12).to(x.dtype))
    with dispatch.prefill_scope(), monkeypatch.context() as m:
        m.setattr(dispatch, "choose", None)  # the copy's call asks nothing else (its host time is the prefill's)
        assert torch.equal(linear(x, w12).view(torch.int32), expected.view(torch.int32)) and len(runs) == 1
    with dispatch.prefill_scope():
        config = configs.heuristic_config(2, WeightFormat.W12, 37, 300)
        linear(x, w12, config=config)
        assert runs[-1] == config and len(runs) == 2  # a config asked for is run as asked
        monkeypatch.setattr(dispatch, "capturing", lambda x: True)
        check(linear(x, w12), x, w12)
        assert len(runs) == 3  # captured into a graph: the kernels, whose launch cost is paid once
        monkeypatch.setattr(dispatch, "capturing", lambda x: False)
    check(linear(x, w12), x, w12)
    assert len(runs) == 4  # outside a prefill: the kernels (a warm-up builds what the capture needs)
