"""tools/train_eagle3.py: its training-time test is exactly what the engine drafts (pairing, label
offsets, positions, what each drafted node attends to), and --smoke runs end to end on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dflash_objective
import pytest
import torch
import train_eagle3

from specpilot.engine.drafters.eagle3 import Eagle3Drafter
from specpilot.models.kv_cache import KVCache
from specpilot.engine.state import DecodeState
from specpilot.engine.steps import prefill
from specpilot.models.eagle3 import random_eagle3
from specpilot.models.eagle3_checkpoint import load_eagle3
from specpilot.models.loading import load_model
from specpilot.models.random_checkpoint import random_model, tiny_config

from tests.tools.conftest import TOOLS


class TeacherForced(Eagle3Drafter):
    """A chain drafter that feeds the true next tokens (as training does) and records each
    level's logits; positions, slots, masks and the carried hidden states are the engine's."""

    def __init__(self, *args, truth, **kw):
        super().__init__(*args, **kw)
        self.truth, self.seen = truth, []

    def _step(self, tokens, carry, positions, slots, mask):
        tokens = torch.full_like(tokens, self.truth[len(self.seen)])
        logits, hidden = super()._step(tokens, carry, positions, slots, mask)
        self.seen.append(torch.log_softmax(logits.float(), -1))
        return logits, hidden


def test_training_steps_equal_engine_drafting(target_dir):
    target = load_model(target_dir)
    draft = random_eagle3(target.config, seed=2)
    ttt = 4
    tokens = torch.randint(1, 4096, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        feats = dflash_objective.target_features(target, tokens, draft.feature_layers)
        steps = train_eagle3.ttt_logits(draft, target, tokens, feats, ttt)
    for t in (3, 9):
        assert [int(labels[0, t]) for _, labels in steps] == tokens[0, t + 2 : t + 2 + ttt].tolist()
        seq = tokens[0, : t + 2].tolist()  # committed through token t+1, the root
        state = DecodeState.allocate(1, 64, 8, "cpu")
        state.reset([seq], (), 10)
        cache = KVCache.allocate(target.config, 1, 64, "cpu", torch.float32)
        # depth-d node = token t+1+d; the engine expands levels 1..ttt-1 with tokens t+2.. fed
        drafter = TeacherForced(draft, target, ttt, 1, ttt, truth=tokens[0, t + 2 :].tolist())
        with torch.inference_mode():
            drafter.start([seq], state, prefill(target, cache, [seq], capture=draft.feature_layers))
            root = torch.log_softmax(draft.logits(drafter.cache.root_hidden), -1)
            drafter.propose(state)
        engine = [root[0]] + [lp[0, 0] for lp in drafter.seen]
        for j, (logits, _) in enumerate(steps):
            assert (engine[j] - torch.log_softmax(logits[0, t], -1)).abs().max() < 1e-4, j


@pytest.mark.slow
def test_smoke_run(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(TOOLS / "train_eagle3.py"), "--smoke", "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((tmp_path / "out" / "training_log.json").read_text())
    assert record["status"] == "ok" and record["training"]["steps"] == 6 and record["layer_ids"] == [2, 1, 0]
    assert all(c["identical_to_ar"] for c in record["engine_check"].values())
    assert all(0 < p["loss"] < 7 * 40 for p in record["training"]["curve"])  # 7 weighted CEs over 4096 tokens
    assert 0 <= record["heldout_top1"] <= 1 and len(record["heldout_top1_by_step"]) == 7
    target = random_model(tiny_config(max_position_embeddings=512), seed=0)
    head = load_eagle3(tmp_path / "out" / "eagle3", target)
    assert head.spec.layer_ids == (2, 1, 0) and head.token_ids() is None
