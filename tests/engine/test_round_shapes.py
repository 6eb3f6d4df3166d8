"""The shapes a decode round runs: the target's verification rows, the drafter's catch-up and
expansions (draft model, EAGLE-3, DFlash), the prefill buckets, and the weight each is timed on."""

from types import SimpleNamespace

import pytest
import torch

from specpilot.config import DrafterKind, System
from specpilot.engine.round_shapes import deployment_shapes, projection_weight
from specpilot.models.random_checkpoint import tiny_config


def test_the_deployments_shapes_are_the_row_counts_it_runs():
    target = tiny_config(hidden_size=256, intermediate_size=1024, num_layers=4)
    drafter = tiny_config(hidden_size=128, intermediate_size=256, num_layers=1)
    system = System().with_changes(topk=8, tree_budget=128, depth=7)
    shapes = deployment_shapes(target, drafter, system, batch=1, tree_nodes=129, draft_forwards=7,
                               drafter_kernels=True)
    rows = {}
    for s in shapes:
        rows.setdefault(s.name, []).append(s.m)
    assert rows["down"] == [129] and "lm_head" not in rows  # verification; lm_head only with kernel_lm_head
    # the catch-up over the window (depth + 1 = 8 rows, the lm_head on the root only), then 6
    # expansions over topk x batch = 8 rows: one shape per row count, counts summed
    assert rows["drafter.qkv"] == [8] and rows["drafter.lm_head"] == [1, 8]
    assert rows["gate_up@prefill"] == rows["drafter.o@prefill"] == [64, 128, 192, 256]  # buckets up to 257 rows
    by_name = {(s.name, s.m): s for s in shapes}
    assert by_name["drafter.down", 8].count == 7 and by_name["down", 129].count == 4
    assert by_name["qkv@prefill", 64].count == 0
    assert by_name["drafter.lm_head", 1].count == 1 and by_name["drafter.lm_head", 8].count == 6
    assert by_name["drafter.lm_head", 8].n == drafter.vocab_size
    narrow = deployment_shapes(target, drafter, system.with_changes(topk=4), 1, 129, 7, drafter_kernels=True)
    counts = {s.m: s.count for s in narrow if s.name == "drafter.down"}
    assert counts == {8: 1, 4: 6}  # the catch-up's window and the expansions' rows apart
    today = deployment_shapes(target, drafter, system, batch=1, tree_nodes=129, draft_forwards=7)
    assert [s.name for s in today] == [s.name for s in shapes]  # tuned all the same
    assert {s.count for s in today if s.name.startswith("drafter.")} == {0}  # the drafter runs cuBLAS today


def test_a_feature_drafters_own_shapes_are_counted_as_it_runs_them():
    """EAGLE-3: its catch-up over batch x (depth + 1) rows through fc and its layer (qkv reads 2C),
    the lm_head on the roots, then depth - 1 expansions over batch x topk; DFlash: its context and
    its block over batch x block_size rows (projections twice, fc once), no lm_head of its own."""
    from specpilot.models.dflash import DFlashSpec
    from specpilot.models.eagle3 import Eagle3Spec

    target = tiny_config(hidden_size=256, intermediate_size=1024, num_layers=4)
    head = tiny_config(hidden_size=256, intermediate_size=512, num_layers=1)
    eagle3 = SimpleNamespace(config=head, spec=Eagle3Spec((1, 2, 3), 256, 1000))
    system = System().with_changes(drafter=DrafterKind.EAGLE3, depth=5, topk=4,
                                                               tree_budget=32)
    shapes = {(s.name, s.m): s for s in deployment_shapes(target, eagle3, system, 2, 33, 5, drafter_kernels=True)}
    qkv_n = (head.num_heads + 2 * head.num_kv_heads) * head.head_dim
    assert (shapes["drafter.qkv", 12].n, shapes["drafter.qkv", 12].k) == (qkv_n, 512)  # 2 x (5 + 1) rows
    assert (shapes["drafter.fc", 12].n, shapes["drafter.fc", 12].k, shapes["drafter.fc", 12].count) == (256, 768, 1)
    assert shapes["drafter.lm_head", 2].count == 1 and shapes["drafter.lm_head", 2].n == 1000
    assert shapes["drafter.down", 8].count == shapes["drafter.lm_head", 8].count == 4  # 2 x topk rows, 4 levels
    assert ("drafter.fc@prefill", 64 * 2) in shapes and ("drafter.fc", 8) not in shapes

    dflash = SimpleNamespace(config=tiny_config(hidden_size=256, intermediate_size=512, num_layers=2),
                             spec=DFlashSpec((1, 3), block_size=8))
    system = system.with_changes(drafter=DrafterKind.DFLASH, block_size=8)
    shapes = {(s.name, s.m): s for s in deployment_shapes(target, dflash, system, 1, 33, 7, drafter_kernels=True)}
    drafted = {name: s.count for (name, m), s in shapes.items() if name.startswith("drafter.") and s.count}
    assert drafted == {"drafter.qkv": 4, "drafter.o": 4, "drafter.gate_up": 4, "drafter.down": 4, "drafter.fc": 1}
    assert shapes["drafter.fc", 8].k == 512 and ("drafter.lm_head", 8) not in shapes
    off = deployment_shapes(target, dflash, system, 1, 33, 7)  # cuBLAS today: tuned, counted 0
    assert {s.count for s in off if s.name.startswith("drafter.")} == {0}


def test_each_shape_is_timed_on_the_weight_of_its_own_model():
    """The first block's projections, the lm_head and fc of each model, target first."""
    from specpilot.models.eagle3 import random_eagle3
    from specpilot.models.transformer import Transformer

    target = Transformer(tiny_config(hidden_size=64, intermediate_size=128, num_layers=2))
    head = random_eagle3(target.config, layer_ids=(0, 1, 1))
    assert projection_weight([target, head], 128 * 2, 64) is target.layers[0].mlp.gate_up_proj.weight
    qkv = head.midlayer.self_attn.qkv_proj.weight
    assert qkv.shape[1] == 128 and projection_weight([target, head], *qkv.shape) is qkv
    assert projection_weight([target, head], *head.fc.weight.shape) is head.fc.weight
    assert projection_weight([target, head], *target.lm_head.weight.shape) is target.lm_head.weight
    with pytest.raises(KeyError, match=r"\[7, 7\]"):
        projection_weight([target], 7, 7)


def test_an_fp8_targets_projections_are_passed_over_for_the_drafters_weights():
    """An `FP8Linear` holds codes and scales, no `weight`: the drafter's shapes (and the BF16
    lm_head) still find theirs behind an FP8 target."""
    from specpilot.models.fp8_checkpoint import quantize_model
    from specpilot.models.transformer import Transformer

    target = quantize_model(Transformer(tiny_config(hidden_size=64, intermediate_size=128, num_layers=2)),
                            False, "cpu", torch.float32, "test")
    drafter = Transformer(tiny_config(hidden_size=64, intermediate_size=128, num_layers=1))
    up = drafter.layers[0].mlp.gate_up_proj.weight
    assert projection_weight([target, drafter], *up.shape) is up
    assert projection_weight([target, drafter], *target.lm_head.weight.shape) is target.lm_head.weight
