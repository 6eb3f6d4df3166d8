"""tools/train_hybrid.py: the hybrid it builds is the one the brief names, its prompts and greedy
data are what the engine would produce, and --smoke runs the whole pipeline on CPU into checkpoints
that load and that the engine decodes exactly as AR does."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

import dflash_objective
import pytest
import torch
import torch.nn.functional as F
import train_eagle3
import train_hybrid

from specpilot.engine.generator import Generator
from specpilot.models.eagle3_checkpoint import load_eagle3, write_eagle3
from specpilot.models.fixture import fixture_available, fixture_path
from specpilot.models.hybrid import HybridTransformer
from specpilot.models.loading import load_model
from specpilot.models.random_checkpoint import random_hybrid, random_model, tiny_config, tiny_hybrid_config

from tests.tools.conftest import TOOLS


def test_full_preset_is_the_qwen3_5_hybrid_of_8_9m_parameters():
    config = train_hybrid.hybrid_config(train_hybrid.FULL, 8192)
    model = HybridTransformer(config)
    assert config.family == "qwen3_5" and config.linear_layers == (0, 1, 2, 4, 5, 6)
    assert config.attention_layers == (3, 7) and config.rotary_dim == 16 and config.tie_word_embeddings
    assert sum(p.numel() for p in model.parameters()) == config.num_params
    assert 8.8e6 < config.num_params < 9.0e6


def test_init_sets_the_gdn_gates_in_their_ranges():
    model = HybridTransformer(train_hybrid.hybrid_config(train_hybrid.SMOKE, 512))
    train_hybrid.init_hybrid(model, seed=0)
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            assert 1.0 <= float(p.detach().exp().min()) and float(p.detach().exp().max()) <= 16.0
        elif name.endswith("dt_bias"):
            dt = F.softplus(p.detach())
            assert 1e-3 * 0.999 <= float(dt.min()) and float(dt.max()) <= 1e-1 * 1.001
        elif name.endswith("linear_attn.norm.weight"):
            assert torch.equal(p, torch.ones_like(p))
        elif name.endswith("norm.weight"):  # zero-centred: scale 1 + w
            assert torch.equal(p, torch.zeros_like(p))
    again = HybridTransformer(model.config)
    train_hybrid.init_hybrid(again, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))


def test_prompts_stay_inside_one_document_and_repeat_for_a_seed():
    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(1, 100, (int(n),), generator=g) for n in torch.randint(5, 300, (40,), generator=g)]
    stream = torch.cat([torch.cat([d, torch.zeros(1, dtype=d.dtype)]) for d in docs]).int()
    prompts = train_hybrid.stream_prompts({"a": stream}, 50, 8, 64, seed=3)
    assert len(prompts) == 50 and prompts == train_hybrid.stream_prompts({"a": stream}, 50, 8, 64, seed=3)
    text = stream.tolist()
    for q in prompts:
        assert 8 <= len(q) <= 64 and 0 not in q
        assert any(text[i : i + len(q)] == q for i in range(len(text) - len(q) + 1))
    starts = {tuple(d[: len(q)].tolist()) for q in prompts for d in docs}
    assert sum(tuple(q) in starts for q in prompts) >= 10  # about half begin a document


def test_greedy_data_is_prompt_plus_the_engines_greedy_continuation():
    target = random_hybrid(tiny_hybrid_config(), seed=1).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 4096, (n,), generator=g).tolist() for n in (5, 9, 7, 12, 6)]
    S = 20
    tokens, starts = train_hybrid.greedy_data(target, prompts, S, batch=2, seed=0)
    assert tokens.shape == (5, S) and sorted(starts.tolist()) == sorted(map(len, prompts))
    gen = Generator(target, cuda_graphs=False)
    for row, start in zip(tokens.tolist(), starts.tolist()):
        prompt = row[:start]
        assert prompt in prompts
        assert row[start:] == gen.generate([prompt], S - start, stop_at_eos=False).outputs[0]
    first, _ = train_hybrid.greedy_data(target, prompts, S, batch=2, seed=0, until=0.0)
    assert len(first) == 2  # past the deadline: one batch, never none


def test_reduced_draft_vocabulary_trains_on_its_tokens_and_scores_in_target_ids(tmp_path):
    """train_eagle3 with a d2t vocabulary (what the hybrid's head ships with): the vocabulary is
    the most frequent *generated* tokens, labels outside it carry no loss, and top-1 compares the
    target ids the engine would draft."""
    target = random_model(tiny_config(), seed=0)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 4096, (3, 24), generator=g)
    tokens[:, 10:] = torch.randint(1, 12, (3, 14), generator=g)  # the generated parts use few ids
    starts = torch.tensor([10, 10, 10])
    vocab = train_eagle3.draft_vocab_ids(tokens, starts, 4096, 8)
    counts = torch.bincount(tokens[:, 10:].flatten(), minlength=4096)
    assert vocab.tolist() == sorted(vocab.tolist()) and int(counts[vocab].min()) >= int(counts.topk(9).values[-1])
    args = argparse.Namespace(ttt=3, decay=0.8, intermediate_size=0, seed=0)
    head = train_eagle3.new_head(target, (2, 1, 0), args, vocab)
    assert torch.equal(head.token_ids(), vocab) and torch.equal(head.lm_head.weight, target.embed_tokens.weight[vocab])
    with torch.no_grad():
        feats = dflash_objective.target_features(target, tokens, head.feature_layers)
        loss, top1, _ = train_eagle3.ttt_loss(head, target, tokens, starts, feats, args)
        want_loss, want_top1 = 0.0, []
        for j, (logits, labels) in enumerate(train_eagle3.ttt_logits(head, target, tokens, feats, args.ttt)):
            labels = labels.masked_fill(torch.arange(labels.shape[1])[None] + 2 + j < starts[:, None], -100)
            valid = labels >= 0
            covered = valid & torch.isin(labels, vocab)
            index = torch.searchsorted(vocab, labels.clamp(min=0))
            ce = F.cross_entropy(logits[covered].float(), index[covered])
            want_loss += args.decay**j * ce
            want_top1.append(float(((vocab[logits.argmax(-1)] == labels) & valid).sum() / valid.sum()))
    assert torch.allclose(loss, want_loss, rtol=1e-6) and top1 == pytest.approx(want_top1, abs=1e-7)
    write_eagle3(head, tmp_path / "head", dtype=torch.float32)
    assert torch.equal(load_eagle3(tmp_path / "head", target).token_ids(), vocab)


@pytest.mark.slow
@pytest.mark.skipif(not fixture_available(), reason="needs the shipped dense fixture (target, drafter)")
def test_smoke_run(tmp_path):
    import fixture_pack

    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TRITON_INTERPRET", None)  # the torch GDN reference on CPU, never the interpreted kernels
    out, parts = tmp_path / "out", tmp_path / "parts"
    cmd = [sys.executable, str(TOOLS / "train_hybrid.py"), "--smoke", "--out", str(out), "--pack-to", str(parts),
           "--hybrid-steps", "20", "--eagle-steps", "6"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    record = json.loads((out / "training_log.json").read_text())
    assert record["status"] == "ok" and "eagle3_error" not in record and "checks_error" not in record
    assert record["training"]["hybrid"]["steps"] == 20 and record["eagle3"]["training"]["steps"] == 6
    assert record["engine_check"]["all_equal_to_ar"]
    for group in ("heldout", "benchmark_first_prompts"):
        checks = record["engine_check"][group]["hybrid"]
        assert {"draft_model_chain", "draft_model_tree", "eagle3_chain", "eagle3_tree"} <= set(checks)
        assert all(1.0 <= c["mean_accepted_length"] <= 7.0 for c in checks.values())
    for v in record["heldout"].values():
        assert math.isfinite(v["hybrid_loss"]) and 0 <= v["drafter_top1_agreement_with_hybrid"] <= 1

    hybrid = load_model(out / "hybrid")
    assert hybrid.config.family == "qwen3_5" and hybrid.config.hybrid and hybrid.config.vocab_size == 8192
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / "hybrid" / f).read_bytes() == (fixture_path("target") / f).read_bytes()
    head = load_eagle3(out / "hybrid_eagle3", hybrid)
    assert head.spec.draft_vocab_size == train_hybrid.SMOKE.draft_vocab and head.token_ids() is not None
    installed = fixture_pack.unpack(parts, tmp_path / "installed")
    assert {"hybrid/model.safetensors", "hybrid/training_log.json", "hybrid_eagle3/model.safetensors"} <= set(installed)
