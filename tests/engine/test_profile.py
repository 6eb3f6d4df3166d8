"""The warm-up before a timed generation."""

from types import SimpleNamespace

from specpilot.engine.profile import WARMUP_TOKENS, warm_up


def test_the_warm_up_is_a_short_generation_of_the_same_prompts():
    calls = []
    gen = SimpleNamespace(generate=lambda prompts, n: calls.append((prompts, n)))
    warm_up(gen, [[1, 2, 3]], 256)
    assert calls == [([[1, 2, 3]], WARMUP_TOKENS)]
    warm_up(gen, [[1]], 3)  # never longer than the timed run
    assert calls[-1] == ([[1]], 3)


def test_the_profile_counts_the_weights_a_token_touches(target_dir, drafter_dir, make_prompts):
    """Parameters per token (the lm_head's apart, which W12 leaves in BF16) and the bytes a forward
    streams, of the target and the draft model, from the models the generator runs."""
    import torch

    from specpilot.config import Deployment, DrafterKind, System
    from specpilot.engine.profile import profile
    from specpilot.engine.session import Session

    stock = System(drafter=DrafterKind.MODEL, depth=3, topk=2, tree_budget=5)
    session = Session.load(Deployment(name="p", target=str(target_dir), drafter=str(drafter_dir), stock=stock),
                           device="cpu", dtype=torch.float32)
    p = profile(session.generator(stock), make_prompts(1, seed=5), 6, curve_nodes=(2,))
    t, d = session.target, session.drafter_model
    embed = t.embed_tokens.weight
    assert p.target_params == sum(w.numel() for w in t.parameters()) - (0 if t.lm_head.weight is embed else embed.numel())
    assert p.head_params == t.config.vocab_size * t.config.hidden_size == t.lm_head.weight.numel()
    assert p.target_bytes == 4 * (p.target_params + t.config.hidden_size)  # float32, one embedding row
    assert p.drafter_params == sum(w.numel() for w in d.parameters()) - (
        0 if d.lm_head.weight is d.embed_tokens.weight else d.embed_tokens.weight.numel())
    assert (p.tree_nodes, p.draft_forwards, p.batch) == (6, 3, 1)
