"""tools/train_dflash.py (with its data, `train_data.py`, and objective, `dflash_objective.py`): its
training blocks are exactly what the engine drafts (positions, label offsets, the `kv < anchor`
context), --smoke runs end to end on CPU, a run resumed from its checkpoint ends with the
uninterrupted run's weights, and the variable-prefix loss covers only the offsets past the prefix."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import dflash_objective
import pytest
import torch
import train_checkpoint
import train_data
import train_dflash

from specpilot.config import TreeConstruction
from specpilot.engine.drafters.dflash import DFlashDrafter
from specpilot.models.kv_cache import KVCache
from specpilot.engine.state import DecodeState
from specpilot.engine.steps import prefill
from specpilot.models.dflash import random_dflash
from specpilot.models.dflash_checkpoint import load_dflash
from specpilot.models.loading import load_model
from specpilot.models.random_checkpoint import random_model, tiny_config

from tests.tools.conftest import TOOLS


def test_training_blocks_equal_engine_blocks(target_dir):
    target = load_model(target_dir)
    block = 4
    draft = random_dflash(target.config, num_layers=2, block_size=block, seed=2)
    ids = draft.feature_layers
    tokens = torch.randint(1, 4096, (1, 20), generator=torch.Generator().manual_seed(0))
    anchors = torch.tensor([[5, 11]])
    with torch.no_grad():
        feats = dflash_objective.target_features(target, tokens, ids)
        logits, labels, offset = dflash_objective.block_logits(draft, target, tokens, feats, anchors, block)
    assert labels[0].view(2, block).tolist() == [tokens[0, a : a + block].tolist() for a in (5, 11)]
    drafter = DFlashDrafter(draft, target, block, 8, TreeConstruction.CHAIN)
    for b, a in enumerate((5, 11)):
        seq = tokens[0, : a + 1].tolist()  # committed through the anchor, which is the root
        state = DecodeState.allocate(1, 64, 8, "cpu")
        state.reset([seq], (), 10)
        cache = KVCache.allocate(target.config, 1, 64, "cpu", torch.float32)
        with torch.inference_mode():
            features = prefill(target, cache, [seq], capture=ids)
            drafter.start([seq], state, features)
            engine = drafter.block_logprobs(state)[0]  # [K,V]
        train = torch.log_softmax(logits[0, b * block + 1 : (b + 1) * block], -1)
        assert (engine - train).abs().max() < 1e-4


@pytest.mark.slow
def test_smoke_run(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(TOOLS / "train_dflash.py"), "--smoke", "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((tmp_path / "out" / "training_log.json").read_text())
    assert record["status"] == "ok" and record["training"]["steps"] == 6
    assert all(c["identical_to_ar"] for c in record["engine_check"].values())
    assert all(0 < p["loss"] < 30 for p in record["training"]["curve"])
    target = random_model(tiny_config(max_position_embeddings=512), seed=0)
    assert load_dflash(tmp_path / "out" / "dflash", target).mask_embedding.shape == (64,)


def test_anchor_window_keeps_anchors_early_in_the_continuation():
    g = torch.Generator().manual_seed(0)
    starts = torch.tensor([5, 20, 40])
    a = dflash_objective.sample_anchors(100, starts, 8, g, window=12)
    assert a.shape == (3, 8)
    for row, start in zip(a.tolist(), starts.tolist()):
        assert row == sorted(row) and len(set(row)) == 8
        assert all(start - 1 <= x < start - 1 + 12 for x in row)
    whole = dflash_objective.sample_anchors(100, starts, 50, g)
    assert whole.shape == (3, 50) and int(whole.max()) > 40 + 12  # no window: the whole continuation


def test_bench_check_measures_the_benchmark_sets_losslessly():
    """The shipped fixture target and DFlash drafter on one prompt of each benchmark set (float32)."""
    from argparse import Namespace

    from specpilot.models.fixture import resolve_checkpoint

    target = load_model(resolve_checkpoint("fixture", "target"), dtype=torch.float32)
    args = Namespace(target="fixture", bench_eval=1, gen_tokens=8, block_size=16)
    with torch.inference_mode():
        out = train_dflash.bench_check(target, resolve_checkpoint("fixture-dflash", "dflash"), args, target.device)
    assert set(out) == {"chain-15", "best_first-32", "best_first-64"}
    for r in out.values():
        assert r["prompts"] == 5 and r["identical_to_ar"] == 5
        assert 1.0 <= r["mean_accepted_length"] <= 9.0


def test_teacher_logits_are_the_targets_prediction_of_each_block_token(target_dir):
    """On greedy text the target's argmax at the position that predicted offset k is the label."""
    from specpilot.engine.generator import Generator

    target = load_model(target_dir)
    prompt = torch.randint(1, 4096, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    seq = prompt + Generator(target).generate([prompt], 20, stop_at_eos=False).outputs[0]
    tokens = torch.tensor([seq])
    anchors = torch.tensor([[11, 15, 20]])  # 11: the last prompt token, a root
    block = 4
    with torch.no_grad():
        _, logits = dflash_objective.target_features(target, tokens, (1,), logits=True)
    teacher = dflash_objective.teacher_logits(logits, anchors, block)  # [1,12,V]
    labels = torch.tensor([seq[a : a + block] for a in anchors[0].tolist()]).view(1, -1)
    k = torch.arange(block).repeat(3)
    assert torch.equal(teacher.argmax(-1)[0, k > 0], labels[0, k > 0])


def test_distill_loss_is_ce_at_zero_and_changes_with_the_weight(target_dir):
    from argparse import Namespace

    target = load_model(target_dir)
    draft = random_dflash(target.config, num_layers=1, block_size=4, seed=1)
    tokens = torch.randint(1, 4096, (2, 24), generator=torch.Generator().manual_seed(0))
    starts = torch.tensor([8, 10])
    with torch.no_grad():
        feats, logits = dflash_objective.target_features(target, tokens, draft.feature_layers, logits=True)
        losses = []
        for w in (0.0, 0.5, 1.0):
            args = Namespace(anchors=4, anchor_window=0, block_size=4, gamma=7.0, distill=w)
            losses.append(dflash_objective.block_loss(draft, target, tokens, starts, feats, args,
                                                      torch.Generator().manual_seed(5), logits)[0])
        args = Namespace(anchors=4, anchor_window=0, block_size=4, gamma=7.0, distill=0.0)
        plain = dflash_objective.block_loss(draft, target, tokens, starts, feats, args,
                                            torch.Generator().manual_seed(5))[0]
    assert torch.equal(losses[0], plain)
    assert torch.isclose(losses[1], (losses[0] + losses[2]) / 2, rtol=1e-5)  # linear in w
    assert not torch.isclose(losses[2], losses[0])


def test_stop_at_eos_keeps_anchors_and_labels_before_the_first_generated_eos():
    tokens = torch.tensor([[5, 0, 7, 8, 9, 0, 4, 4, 4, 4], [5, 6, 7, 8, 9, 3, 4, 4, 4, 4]])
    starts = torch.tensor([3, 3])  # row 0's EOS at 1 is in the prompt, at 5 generated
    ends = train_data.eos_ends(tokens, starts, (0,))
    assert ends.tolist() == [6, 10]  # one past the EOS: the EOS is a label
    a = dflash_objective.sample_anchors(10, starts, 5, torch.Generator().manual_seed(0), ends=ends)
    assert a.shape == (2, 5)
    assert sorted(a[0].tolist())[:3] == [2, 3, 4]  # every anchor before the EOS, then fill-ups
    assert all(2 <= x <= 8 for x in a.flatten().tolist())


def test_prompt_mix_draws_question_rows_in_that_fraction():
    question = torch.arange(100) >= 60
    g = torch.Generator().manual_seed(0)
    assert not question[train_data.sample_rows(question, 400, 0.0, g)].any()
    assert question[train_data.sample_rows(question, 400, 1.0, g)].all()
    frac = question[train_data.sample_rows(question, 4000, 0.3, g)].float().mean()
    assert abs(float(frac) - 0.3) < 0.03
    plain = torch.randint(0, 100, (8,), generator=torch.Generator().manual_seed(1))
    assert torch.equal(train_data.sample_rows(torch.zeros(100, dtype=torch.bool), 8, 0.0,
                                                torch.Generator().manual_seed(1)), plain)  # same rows as before


def run_tool(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(TOOLS / "train_dflash.py"), "--smoke", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def split_runs(tmp_path_factory):
    """(one uninterrupted --prefix-max 2 run, the same run in two --resume slices of 3 steps)."""
    root = tmp_path_factory.mktemp("resume")
    whole, split = root / "whole", root / "split"
    proc = run_tool("--prefix-max", "2", "--out", str(whole))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = run_tool("--prefix-max", "2", "--resume", "--stop-after", "3", "--out", str(split))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    partial = json.loads((split / "training_log.json").read_text())
    proc = run_tool("--prefix-max", "2", "--resume", "--out", str(split))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return whole, split, partial


@pytest.mark.slow
def test_resumed_slices_end_with_the_uninterrupted_runs_weights(split_runs):
    from safetensors.torch import load_file

    whole, split, partial = split_runs
    assert partial["status"] == "partial" and partial["training"]["steps"] == 3 and partial["training"]["planned"] == 6
    one, two = (json.loads((d / "training_log.json").read_text()) for d in (whole, split))
    assert two["status"] == "ok" and two["training"]["steps"] == 6
    assert [s["steps"] for s in two["training"]["slices"]] == [[0, 3], [3, 6]]
    assert two["training"]["curve"] == one["training"]["curve"]
    a, b = (load_file(d / "dflash" / "model.safetensors") for d in (whole, split))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (split / "data.pt").is_file() and all(q.stat().st_size <= train_checkpoint.PART_BYTES
                                                 for q in split.glob("checkpoint.pt*"))


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_of_other_arguments(split_runs):
    _, split, _ = split_runs
    proc = run_tool("--prefix-max", "1", "--resume", "--out", str(split))
    assert proc.returncode == 2
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "error:" in line]
    assert len(errors) == 1 and "--prefix-max 2 (now 1)" in errors[0], proc.stderr


def test_checkpoint_parts_are_written_atomically_and_checked(tmp_path, monkeypatch):
    monkeypatch.setattr(train_checkpoint, "PART_BYTES", 1000)
    path = tmp_path / "checkpoint.pt"
    assert train_checkpoint.load(path) is None
    state = {"w": torch.arange(1000, dtype=torch.float32), "step": 3, "curve": [{"loss": 1.5}]}
    train_checkpoint.save(state, path)
    first = sorted(q.name for q in tmp_path.glob("checkpoint.pt.*"))
    assert len(first) >= 4  # 4000 bytes of weights in parts of 1000
    state["step"] = 4
    train_checkpoint.save(state, path)
    second = sorted(q.name for q in tmp_path.glob("checkpoint.pt.*"))
    assert not set(first) & set(second)  # the previous save's parts are gone
    back = train_checkpoint.load(path)
    assert back["step"] == 4 and torch.equal(back["w"], state["w"]) and back["curve"] == state["curve"]
    (tmp_path / second[1]).write_bytes(b"damaged")
    with pytest.raises(ValueError, match="missing or damaged"):
        train_checkpoint.load(path)


def test_prefix_loss_covers_only_the_offsets_past_the_prefix(target_dir):
    from argparse import Namespace

    import torch.nn.functional as F

    labels = torch.tensor([[7, 8, 9, 10] * 3])
    offset = torch.arange(4).repeat(3)[None]
    prefix = torch.tensor([0, 1, 2]).repeat_interleave(4)[None]
    valid, w = dflash_objective.block_weights(labels, offset, prefix, 7.0)
    d = math.exp(-1 / 7)
    expected = torch.tensor([[0, 1, d, d * d, 0, 0, 1, d, 0, 0, 0, 1]])
    assert torch.allclose(w, expected) and torch.equal(valid, expected > 0)

    target = load_model(target_dir)
    draft = random_dflash(target.config, num_layers=1, block_size=4, seed=1)
    tokens = torch.randint(1, 4096, (2, 24), generator=torch.Generator().manual_seed(0))
    starts = torch.tensor([8, 10])
    args = Namespace(anchors=5, anchor_window=0, block_size=4, gamma=7.0, distill=0.0, prefix_max=2)
    with torch.no_grad():
        feats = dflash_objective.target_features(target, tokens, draft.feature_layers)
        loss, _ = dflash_objective.block_loss(draft, target, tokens, starts, feats, args,
                                              torch.Generator().manual_seed(5))
        g = torch.Generator().manual_seed(5)  # the same draws, by hand
        anchors = dflash_objective.sample_anchors(24, starts, 5, g)
        p = dflash_objective.sample_prefix(anchors, 24, 2, g)
        assert p.min() == 0 and p.max() == 2
        logits, labels, offset = dflash_objective.block_logits(draft, target, tokens, feats, anchors, 4, p)
        none = dflash_objective.block_logits(draft, target, tokens, feats, anchors, 4)[0]
        zero = dflash_objective.block_logits(draft, target, tokens, feats, anchors, 4, torch.zeros_like(p))[0]
    assert torch.equal(zero, none)  # p = 0 is the root alone
    assert not torch.equal(logits, none)  # the prefix tokens are inputs
    ce = F.cross_entropy(logits.flatten(0, 1), labels.clamp(min=0).flatten(), reduction="none").view(2, -1)
    num = den = 0.0
    for b in range(2):
        for q in range(ce.shape[1]):
            k, pb = q % 4, int(p[b, q // 4])
            if k > pb and labels[b, q] >= 0:
                num, den = num + float(ce[b, q]) * math.exp(-(k - pb - 1) / 7.0), den + math.exp(-(k - pb - 1) / 7.0)
    assert abs(float(loss) - num / den) < 1e-5 * num / den
    assert dflash_objective.sample_prefix(anchors, 24, 0, g) is None
