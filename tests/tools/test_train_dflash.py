"""tools/train_dflash.py: its training blocks are exactly what the engine drafts (positions,
label offsets, the `kv < anchor` context), and --smoke runs end to end on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import train_dflash

from specpilot.config import TreeConstruction
from specpilot.engine.drafters.dflash import DFlashDrafter
from specpilot.engine.kv_cache import KVCache
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
        feats = train_dflash.target_features(target, tokens, ids)
        logits, labels, offset = train_dflash.block_logits(draft, target, tokens, feats, anchors, block)
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
    a = train_dflash.sample_anchors(100, starts, 8, g, window=12)
    assert a.shape == (3, 8)
    for row, start in zip(a.tolist(), starts.tolist()):
        assert row == sorted(row) and len(set(row)) == 8
        assert all(start - 1 <= x < start - 1 + 12 for x in row)
    whole = train_dflash.sample_anchors(100, starts, 50, g)
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
