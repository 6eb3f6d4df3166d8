"""Two-level verification: the union tree, losslessness with each device drafter (single requests,
a batch, continuous batching, through a `Session` system), the view's chain being accepted, the
knob's checks."""

import pytest
import torch

from specpilot.config import Deployment, DrafterKind, System, TreeConstruction
from specpilot.engine.drafters.dflash import DFlashDrafter
from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.drafters.two_level import TwoLevelDrafter, union
from specpilot.engine.generator import Generator
from specpilot.engine.serving import Request, ServingEngine
from specpilot.engine.session import Session
from specpilot.engine.tree import DraftTree
from specpilot.errors import ConfigError
from specpilot.models.view import fp8_view
from tests.conftest import random_prompts


@pytest.fixture(scope="module")
def view(target):
    return fp8_view(target)


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(4, seed=21)


@pytest.fixture(scope="module")
def ar_outputs(target, prompts):
    return Generator(target).generate(prompts, 32).outputs


def test_union_hangs_the_chain_from_the_root():
    first = DraftTree(torch.tensor([[7, 1, 2, 3]]), torch.tensor([[-1, 0, 0, 1]]), max_depth=2,
                      valid=torch.tensor([[True, True, False, True]]), num_valid=3)
    chain = DraftTree.chain(torch.tensor([[7, 4, 5, 6]]))
    u = union(first, chain)
    assert u.tokens.tolist() == [[7, 1, 2, 3, 4, 5, 6]]
    assert u.parents.tolist() == [[-1, 0, 0, 1, 0, 4, 5]]
    assert u.max_depth == 3 and u.num_valid == 6
    assert u.valid.tolist() == [[True, True, False, True, True, True, True]]
    assert u.depths().tolist() == [[0, 1, 1, 2, 1, 2, 3]]


@pytest.mark.parametrize("inner", ["none", "chain", "tree"])
def test_lossless_with_a_draft_model_or_alone(target, draft, view, prompts, ar_outputs, inner):
    parts = {"none": None, "chain": DraftModelDrafter(draft, 4, 1, 4), "tree": DraftModelDrafter(draft, 3, 3, 8)}
    drafter = TwoLevelDrafter(parts[inner], view, 3)
    result = Generator(target, {drafter.depth: drafter}).generate(prompts, 32)
    assert result.outputs == ar_outputs
    alone = Generator(target, {4: parts["chain"]}).generate(prompts, 32) if inner == "chain" else None
    if alone is not None:  # the view's chain adds accepted tokens to the draft model's
        assert result.mean_accepted_length > alone.mean_accepted_length


def test_the_views_chain_is_accepted_where_the_view_agrees(target, view, prompts):
    """The view alone (chain of 4): a float32 target's FP8 view mostly keeps its argmax."""
    result = Generator(target, {4: TwoLevelDrafter(None, view, 4)}).generate(prompts, 32)
    assert result.mean_accepted_length > 2.0


def test_lossless_with_a_dflash_block_and_under_continuous_batching(target, view, tmp_path_factory, make_prompts):
    from specpilot.models.dflash import random_dflash
    from specpilot.models.dflash_checkpoint import load_dflash, write_dflash

    out = tmp_path_factory.mktemp("dflash")
    write_dflash(random_dflash(target.config, num_layers=1, block_size=6, mask_token_id=5, seed=3), out,
                 dtype=torch.float32)
    inner = DFlashDrafter(load_dflash(out, target), target, 6, 8, TreeConstruction.BEST_FIRST)
    drafter = TwoLevelDrafter(inner, view, 2)
    assert drafter.depth == 5 and drafter.view.window == 6 and drafter.feature_layers == inner.feature_layers
    gen = Generator(target, {5: drafter})
    requests = [Request(tuple(p), max_new=n) for p, n in zip(make_prompts(5, seed=22), (9, 20, 4, 17, 12))]
    ar = [Generator(target).generate([list(r.prompt)], r.max_new).outputs[0] for r in requests]
    result = ServingEngine(gen, 2, prefill_chunk=8).run(requests)
    assert [r.output for r in result.requests] == ar


def test_a_session_system_with_tlv(target_dir, drafter_dir, make_prompts):
    stock = System(depth=3, topk=2, tree_budget=6)
    dep = Deployment(name="t", target=str(target_dir), drafter=str(drafter_dir), stock=stock)
    session = Session.load(dep, device="cpu", dtype=torch.float32)
    prompts = make_prompts(3, seed=23)
    ar = session.generator(stock.plain_ar()).generate(prompts, 24).outputs
    tlv = stock.with_changes(name="tlv", tlv_chain=4)
    gen = session.generator(tlv)
    (drafter,) = gen.drafters.values()
    assert isinstance(drafter, TwoLevelDrafter) and drafter.num_nodes == 7 + 4
    assert gen.generate(prompts, 24).outputs == ar
    assert session.generator(tlv.with_changes(name="again", tlv_chain=2)).drafters[3].view.model is drafter.view.model


def test_the_knob_checks():
    assert System(tlv_chain=3).plain_ar().tlv_chain == 0
    assert System().fingerprint() == System(tlv_chain=0).fingerprint()
    with pytest.raises(ConfigError, match="tlv_chain must be in 0..16"):
        System(tlv_chain=17)
    with pytest.raises(ConfigError, match="tlv_chain adds a chain"):
        System(drafter=DrafterKind.NGRAM, tlv_chain=2)
    with pytest.raises(ConfigError, match="no adaptive_depth tiers"):
        System(tlv_chain=2, adaptive_depth=(2, 4))


def test_generate_takes_tlv_chain(capsys, target_dir, drafter_dir):
    import json

    from specpilot.cli import main

    code = main(["generate", "--target", str(target_dir), "--drafter", str(drafter_dir), "--prompt", "def f(x):",
                 "--max-new-tokens", "16", "--tlv-chain", "2", "--json", "--compare-ar"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["knobs"]["tlv_chain"] == 2 and report["identical_to_ar"]
    assert main(["generate", "--target", str(target_dir), "--drafter", "ngram", "--prompt", "x", "--tlv-chain", "2"]) == 2
    assert capsys.readouterr().err.count("error:") == 1
