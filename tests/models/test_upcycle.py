"""Upcycling a dense decoder into identical experts (`models.upcycle`, a deployment's
`target_experts`): the fixture's function up to float32 rounding, each expert its own memory, a
router that routes by the hidden state, the same router everywhere, and the targets it refuses."""

from __future__ import annotations

import pytest
import torch

from specpilot.engine.session import load_role
from specpilot.engine.steps import chunk_forward
from specpilot.errors import CheckpointError
from specpilot.models.moe import MoETransformer, SparseMoE
from specpilot.models.upcycle import upcycle


@pytest.fixture(scope="module")
def dense():
    return load_role("fixture", "target", 1, "cpu", torch.float32)


@pytest.fixture(scope="module")
def upcycled(dense):
    return upcycle(dense, 8, 2)


def test_the_upcycled_fixture_computes_the_dense_function(dense, upcycled):
    tokens = torch.randint(0, dense.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    start = torch.zeros(2, dtype=torch.long)
    want = chunk_forward(dense, dense.new_cache(2, 32), tokens, start)
    got = chunk_forward(upcycled, upcycled.new_cache(2, 32), tokens, start)
    # sum_j w_j MLP(x) with sum_j w_j = 1 up to float32 rounding
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_every_layer_holds_its_own_copies_and_routes_by_the_hidden_state(dense, upcycled):
    assert isinstance(upcycled, MoETransformer)
    c = upcycled.config
    assert (c.num_experts, c.num_experts_per_tok, c.norm_topk_prob) == (8, 2, True)
    assert c.moe_layers == tuple(range(c.num_layers))
    for i, layer in enumerate(upcycled.layers):
        assert isinstance(layer.mlp, SparseMoE)
        gate_up = layer.mlp.experts.gate_up_proj  # [E,2I,C]
        assert gate_up.is_contiguous() and gate_up.untyped_storage().nbytes() == gate_up.numel() * 4
        assert all(torch.equal(gate_up[e], dense.layers[i].mlp.gate_up_proj.weight) for e in range(8))
        assert torch.equal(layer.mlp.experts.down_proj[3], dense.layers[i].mlp.down_proj.weight)
    x = torch.randn(64, c.hidden_size, generator=torch.Generator().manual_seed(1))
    weights, ids = upcycled.layers[0].mlp.route(x)
    assert torch.unique(ids).numel() == 8  # tokens spread over every expert
    assert torch.allclose(weights.sum(-1), torch.ones(64))


def test_the_router_is_the_same_on_every_build(dense, upcycled):
    again = upcycle(dense, 8, 2)
    assert torch.equal(again.layers[5].mlp.gate.weight, upcycled.layers[5].mlp.gate.weight)
    other = upcycle(dense, 8, 2, seed=1)
    assert not torch.equal(other.layers[5].mlp.gate.weight, upcycled.layers[5].mlp.gate.weight)


def test_it_refuses_sparse_targets_and_bad_counts(upcycled, dense):
    with pytest.raises(CheckpointError, match="already sparse"):
        upcycle(upcycled, 4, 2)
    with pytest.raises(CheckpointError, match="k = 3"):
        upcycle(dense, 2, 3)
