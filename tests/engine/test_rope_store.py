"""`rope_store = true`: each dense attention layer of the target and of the draft model runs q/k
norm, RoPE and the cache write in one kernel (`kernels.rope_store`), on clones sharing the
session's tensors, and speculative decoding stays lossless (float32: the greedy tokens of AR with
the same knob). On CPU the kernel runs under Triton's interpreter."""

import dataclasses

import pytest
import torch

from specpilot.config import AttentionKernel, Deployment, DrafterKind, Kernel, System
from specpilot.engine.session import Session, ran_on_device
from specpilot.errors import ConfigError
from specpilot.kernels import rope_store
from specpilot.models.random_checkpoint import (
    tiny_config,
    write_random_checkpoint,
    write_truncated_drafter,
)
from specpilot.models.transformer import Attention

STOCK = System(drafter=DrafterKind.MODEL, depth=2, topk=2, tree_budget=4)


@pytest.fixture
def interpreted(interpreter):
    interpreter("specpilot.kernels.rope_store_kernel", "rope_store_kernel")


@pytest.fixture(scope="module")
def d32_dirs(tmp_path_factory):
    """A two-layer float32 target and a one-layer drafter with heads of 32 (the kernel's smallest)."""
    root = tmp_path_factory.mktemp("rope_store")
    target = write_random_checkpoint(root / "target", tiny_config(num_layers=2, head_dim=32), seed=0)
    return target, write_truncated_drafter(target, root / "drafter", num_layers=1)


def session(dirs) -> Session:
    return Session.load(Deployment(name="r", target=str(dirs[0]), drafter=str(dirs[1]), stock=STOCK),
                        device="cpu", dtype=torch.float32)


def stores(model) -> set:
    return {m.rope_store for m in model.modules() if isinstance(m, Attention)}


@pytest.mark.parametrize("changes", [{}, {"attention": AttentionKernel.SPLIT_KV.value},
                                     {"draft_kernel": Kernel.FUSED.value}], ids=["sdpa", "split_kv", "fused"])
def test_speculative_rounds_with_rope_store_give_the_ar_tokens_with_it(interpreted, d32_dirs, make_prompts,
                                                                       monkeypatch, changes):
    s = session(d32_dirs)
    prompts = make_prompts(2, seed=4, lo=4, hi=9)
    system = STOCK.with_knobs({"rope_store": True, **changes}, name="rope")
    want = s.generator(system.plain_ar("rope-ar")).generate(prompts, 6).outputs
    assert want == s.generator(STOCK.plain_ar()).generate(prompts, 6).outputs  # float32: the same tokens as without
    rows = []
    real = rope_store.qk_norm_rope_store_eager
    monkeypatch.setattr(rope_store, "qk_norm_rope_store_eager",
                        lambda qkv, *a: rows.append(qkv.shape[:2]) or real(qkv, *a))
    gen = s.generator(system)
    assert gen.generate(prompts, 6).outputs == want
    draft = next(iter(gen.drafters.values())).model
    assert stores(gen.target) == {True} == stores(draft)
    assert stores(s.target) == {False} == stores(s.drafter_model)  # the session's own models are left alone
    assert gen.target.embed_tokens.weight is s.target.embed_tokens.weight  # shared, not copied
    assert rows  # the kernel ran (the modules do not just carry the setting)


def test_without_a_gpu_or_the_interpreter_it_is_one_config_error_and_reported(d32_dirs, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    system = STOCK.with_changes(name="rope", rope_store=True)
    with pytest.raises(ConfigError, match="rope_store = true needs a CUDA device"):
        session(d32_dirs).generator(system)
    assert ran_on_device(system, "cpu")["rope_store"][0] is False
    assert "rope_store" not in ran_on_device(system, "cuda")
    assert "rope_store" not in ran_on_device(STOCK, "cpu")


def test_the_knob_reads_from_toml_and_leaves_default_fingerprints_alone():
    on = System.from_dict({"rope_store": True}, name="r")
    assert on.rope_store and "rope_store = true" in on.to_toml()
    assert System.from_dict({k: v for k, v in on.knobs().items()}, name="r") == on
    assert on.fingerprint() != System().fingerprint()
    assert dataclasses.replace(System(), rope_store=False).fingerprint() == System().fingerprint()
    with pytest.raises(ConfigError, match="rope_store must be bool"):
        System.from_dict({"rope_store": "yes"})


def test_compiled_rounds_keep_the_plain_ops_and_give_the_eager_tokens(traced, interpreted, d32_dirs, make_prompts,
                                                                      monkeypatch):
    """Under both compile knobs the traced forwards never launch the kernel (inductor fuses the plain
    ops it replaces), and the compiled rounds commit the eager rounds' tokens (float32)."""
    from specpilot.kernels import rope_store as R

    s = session(d32_dirs)
    prompts = make_prompts(1, seed=2, lo=4, hi=8)
    system = STOCK.with_changes(name="rope", rope_store=True)
    eager = s.generator(system).generate(prompts, 5)
    assert not traced
    launched = []
    real = R.qk_norm_rope_store_eager
    monkeypatch.setattr(R, "qk_norm_rope_store_eager", lambda *a: launched.append(
        torch.compiler.is_compiling()) or real(*a))
    compiled = s.generator(system.with_changes(name="compiled", draft_compile=True, verify_compile=True))
    out = compiled.generate(prompts, 5)
    assert traced and True not in launched  # eager prefills may launch it; a traced forward never does
    assert out.outputs == eager.outputs
