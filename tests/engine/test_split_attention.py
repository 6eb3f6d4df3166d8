"""`attention = "split_kv"`: every cached attention of the target and the drafter runs the split-KV
kernel, and decoding stays lossless (float32: the greedy tokens of AR over torch's SDPA), for dense
and Gemma targets alike. On CPU the kernel runs under Triton's interpreter."""

import dataclasses

import pytest
import torch

from specpilot.config import AttentionKernel, Deployment, DrafterKind, System
from specpilot.engine.session import Session
from specpilot.errors import ConfigError
from specpilot.models.dflash import random_dflash
from specpilot.models.dflash_checkpoint import write_dflash
from specpilot.models.eagle3 import random_eagle3
from specpilot.models.eagle3_checkpoint import write_eagle3
from specpilot.models.loading import load_model
from specpilot.models.transformer import CachedAttention

SPLIT = AttentionKernel.SPLIT_KV
AR = System(name="ar", drafter=DrafterKind.NONE)


@pytest.fixture(scope="module")
def drafter_dirs(target_dir, drafter_dir, tmp_path_factory):
    target = load_model(target_dir)
    root = tmp_path_factory.mktemp("split")
    eagle3 = write_eagle3(random_eagle3(target.config, seed=5), root / "e", dtype=torch.float32)
    dflash = write_dflash(random_dflash(target.config, num_layers=1, block_size=5, mask_token_id=3, seed=4),
                          root / "d", dtype=torch.float32)
    return {"model": drafter_dir, "eagle3": eagle3, "dflash": dflash}


def session_drafting_with(kind, target_dir, drafter_dirs) -> tuple[Session, System]:
    stock = System(drafter=DrafterKind(kind), depth=3, topk=2, tree_budget=5, block_size=5)
    dep = Deployment(name="s", target=str(target_dir), drafter=str(drafter_dirs[kind]), stock=stock)
    return Session.load(dep, device="cpu", dtype=torch.float32), stock


def counted_split_attention(monkeypatch) -> list:
    """The q shapes of every split-KV attention call from here on."""
    from specpilot.models import transformer

    calls, real = [], transformer.split_attention

    def counted(q, *args):
        calls.append(tuple(q.shape))
        return real(q, *args)

    monkeypatch.setattr(transformer, "split_attention", counted)
    return calls


def kernels_of(model) -> set:
    return {m.kernel for m in model.modules() if isinstance(m, CachedAttention)}


@pytest.mark.parametrize("kind", ["model", "eagle3", "dflash"])
def test_speculative_rounds_over_split_attention_give_the_ar_tokens(interpreted_kernels, target_dir, drafter_dirs,
                                                                    make_prompts, monkeypatch, kind):
    session, stock = session_drafting_with(kind, target_dir, drafter_dirs)
    prompts = make_prompts(1, seed=4, lo=5, hi=12)
    want = session.generator(AR).generate(prompts, 8).outputs
    calls = counted_split_attention(monkeypatch)
    split = dataclasses.replace(stock, name="split", attention=SPLIT)
    gen = session.generator(split)
    assert gen.generate(prompts, 8).outputs == want
    drafter = next(iter(gen.drafters.values()))
    assert kernels_of(gen.target) == {SPLIT} and kernels_of(drafter.model) == {SPLIT}
    assert calls  # the kernel ran (the modules do not just carry the setting)


def test_ar_over_split_attention_gives_the_sdpa_tokens_and_leaves_the_sessions_models_alone(
        interpreted_kernels, target_dir, drafter_dirs, make_prompts, monkeypatch):
    """The split system runs on clones sharing every tensor: the session's own target and draft
    model keep SDPA, and so does a system built after it. Chunks longer than MAX_QUERIES (prefill)
    stay on SDPA."""
    from specpilot.models import transformer

    session, stock = session_drafting_with("model", target_dir, drafter_dirs)
    prompts = make_prompts(2, seed=6, lo=3, hi=20)
    assert max(len(p) for p in prompts) > 7
    want = session.generator(AR).generate(prompts, 6).outputs
    calls = counted_split_attention(monkeypatch)
    monkeypatch.setattr(transformer, "MAX_QUERIES", 6)
    split_ar = session.generator(dataclasses.replace(AR, name="split-ar", attention=SPLIT))
    assert split_ar.generate(prompts, 6).outputs == want
    assert calls and max(shape[1] for shape in calls) <= 6  # [B,T,H,D]: the decode steps, not the prefill
    assert split_ar.target.embed_tokens.weight is session.target.embed_tokens.weight
    session.generator(dataclasses.replace(stock, name="split", attention=SPLIT))
    assert kernels_of(session.target) == {AttentionKernel.SDPA} == kernels_of(session.drafter_model)
    assert kernels_of(session.generator(stock).target) == {AttentionKernel.SDPA}


def test_without_a_gpu_or_the_interpreter_split_attention_is_one_config_error(target_dir, drafter_dirs, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    session, stock = session_drafting_with("model", target_dir, drafter_dirs)
    with pytest.raises(ConfigError, match="attention = 'split_kv' needs a CUDA device"):
        session.generator(dataclasses.replace(stock, name="split", attention=SPLIT))


def test_the_knob_reads_from_toml_changes_the_fingerprint_and_rejects_unknown_kernels():
    split = System.from_dict({"attention": "split_kv"}, name="s")
    assert split.attention is SPLIT and "attention = \"split_kv\"" in split.to_toml()
    assert split.fingerprint() != System().fingerprint()
    assert dataclasses.replace(System(), attention=AttentionKernel.SDPA).fingerprint() == System().fingerprint()
    with pytest.raises(ConfigError, match="attention: 'flash' is not one of sdpa, split_kv"):
        System.from_dict({"attention": "flash"})


def test_served_by_continuous_batching_over_attention_spans_each_request_gets_its_ar_tokens(
        interpreted_kernels, target_dir, drafter_dir, monkeypatch):
    """Rows of different lengths, admitted while others decode, rounds attending over spans of the
    cache (`attention_span`: K/V views cut to their first slots) and packed prefill: the split kernel
    sees every layout the serving engine gives attention."""
    from specpilot.engine.drafters.draft_model import DraftModelDrafter
    from specpilot.engine.generator import Generator
    from specpilot.engine.serving import Request, ServingEngine
    from specpilot.models.transformer import use_attention

    target, draft = load_model(target_dir), load_model(drafter_dir)
    g = torch.Generator().manual_seed(5)
    requests = [Request(tuple(torch.randint(1, 4096, (int(n),), generator=g).tolist()), max_new=4)
                for n in torch.randint(2, 30, (3,), generator=g)]
    ar = [Generator(target).generate([list(r.prompt)], r.max_new).outputs[0] for r in requests]
    use_attention(target, SPLIT)
    use_attention(draft, SPLIT)
    calls = counted_split_attention(monkeypatch)
    gen = Generator(target, {3: DraftModelDrafter(draft, 3, 2, 5)}, attention_span=64)
    result = ServingEngine(gen, 2, prefill_chunk=16).run(requests)
    assert [r.output for r in result.requests] == ar
    assert calls


GEMMA = ("gemma3", "gemma4", "gemma4_shared")


@pytest.fixture(scope="module")
def gemma_dirs(tmp_path_factory):
    """Per Gemma variant of `tests.models.test_gemma` (Gemma-3's query_pre_attn_scalar; Gemma-4's
    scale of 1 and wider global heads; KV-shared layers and values from keys): a target, and a draft
    model of another seed, both with sliding layers of window 8."""
    pytest.importorskip("transformers")
    from tests.models import test_gemma

    root = tmp_path_factory.mktemp("gemma")
    for variant in GEMMA:
        test_gemma.hf_checkpoint(root / variant, variant)
        test_gemma.hf_checkpoint(root / f"{variant}-draft", variant, seed=1)
    return root


@pytest.mark.parametrize("variant", GEMMA)
def test_gemma_rounds_over_split_attention_give_the_sdpa_tokens(interpreted_kernels, gemma_dirs, monkeypatch,
                                                                variant):
    """A Gemma target and draft model under `attention = "split_kv"`: every attention module of both
    runs the kernel with the layer's own scale, sliding layers over a ring (a bias over its
    entries), the long prompt's prefill (more tokens than the ring's slack: the ring as it was plus
    the chunk's own keys) included; AR and tree rounds give AR's tokens over SDPA."""
    stock = System(drafter=DrafterKind.MODEL, depth=3, topk=2, tree_budget=5)
    dep = Deployment(name="g", target=str(gemma_dirs / variant), drafter=str(gemma_dirs / f"{variant}-draft"),
                     stock=stock)
    session = Session.load(dep, device="cpu", dtype=torch.float32)
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(1, 4096, (n,), generator=g).tolist() for n in (90, 12)]
    want = session.generator(AR).generate(prompts, 8, stop_at_eos=False).outputs
    calls = counted_split_attention(monkeypatch)
    for system in (dataclasses.replace(AR, name="split-ar", attention=SPLIT),
                   dataclasses.replace(stock, name="split", attention=SPLIT)):
        gen = session.generator(system)
        assert gen.generate(prompts, 8, stop_at_eos=False).outputs == want
        (ws,) = gen.workspaces.values()
        assert ws.cache.ring is not None
        assert kernels_of(gen.target) == {SPLIT}
    drafter = next(iter(gen.drafters.values()))
    assert kernels_of(drafter.model) == {SPLIT}
    slack = ws.cache.ring.slack
    assert max(shape[1] for shape in calls) > slack and min(shape[1] for shape in calls) == 1
    assert kernels_of(session.target) == {AttentionKernel.SDPA}


@pytest.mark.parametrize("variant", GEMMA)
def test_gemma_logits_over_split_attention_are_sdpas(interpreted_kernels, gemma_dirs, monkeypatch, variant):
    """Through a ring: a prefill chunk longer than the slack, a 12-node tree past the window, one
    decode token; the logits of every step equal SDPA's to float32 rounding (the kernel sums in
    another order), where a wrong scale or mask would move them by far more."""
    from specpilot.engine.steps import chunk_forward, tree_forward
    from specpilot.engine.tree import DraftTree
    from specpilot.models.transformer import use_attention

    sdpa, split = load_model(gemma_dirs / variant), load_model(gemma_dirs / variant)
    use_attention(split, SPLIT)
    calls = counted_split_attention(monkeypatch)
    g = torch.Generator().manual_seed(9)
    prompt = torch.randint(0, 4096, (1, 90), generator=g)
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3, 5, 6, 8, 9, 10]])
    tree = DraftTree(torch.randint(0, 4096, parents.shape, generator=g), parents, max_depth=7)
    logits = []
    for model in (sdpa, split):
        cache = model.new_cache(1, 256, nodes=12)
        assert cache.ring is not None and cache.ring.slack < prompt.shape[1]
        with torch.no_grad():
            first = chunk_forward(model, cache, prompt, torch.zeros(1, dtype=torch.long))[0]
            nodes = tree_forward(model, cache, tree, torch.tensor([90]))[0]
            step = chunk_forward(model, cache, tree.tokens[:, :1], torch.tensor([90]))[0]
        logits.append(torch.cat([first, nodes, step]))
    want, got = logits
    assert {shape[3] for shape in calls} == set(split.config.layer_head_dims)  # sliding and global layers
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
