"""scripts/dflash_positions.py: the loop split and the per-offset accuracy of the shipped drafter."""

from __future__ import annotations

import json

import pytest


def test_looping_marks_ngrams_seen_before(bench_script):
    script = bench_script("dflash_positions")
    seq = [1, 2, 3, 9, 1, 2, 3, 4]
    assert script.looping(seq, 3) == [False, False, False, False, True, False, False, False]
    assert script.looping([5, 5, 5, 5], 2) == [False, True, True, False]


def test_the_walk_roots_each_round_after_the_last_accepted_draft(bench_script):
    import torch

    script = bench_script("dflash_positions")
    # block of 4 (3 drafts); row 0, the last prompt token, is the first root
    hits = torch.tensor([[1, 0, 1], [1, 1, 1], [1, 1, 0], [0, 0, 0], [1, 1, 1], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)
    # row 0 accepts 1 (+bonus): 2 tokens; root row 2 accepts 2: 5; root row 5 accepts 0: 6; row 6 accepts 3: 10
    assert script.walk(hits, 6) == (6, 3)
    assert script.walk(hits, 7) == (7, 4)
    with pytest.raises(ValueError):
        script.walk(hits, 11)


@pytest.mark.slow
def test_shipped_drafter_on_cpu(bench_script, tmp_path):
    script = bench_script("dflash_positions")
    assert script.main(["--out", str(tmp_path), "--n-prompts", "1", "--tokens", "24", "--device", "cpu"]) == 0
    doc = json.loads((tmp_path / "dflash_positions.json").read_text())
    assert doc["prompts"] == 5 and doc["block_size"] == 16
    assert doc["all"]["anchors"] == doc["looping"]["anchors"] + doc["fresh"]["anchors"] == 5 * (24 - 16 + 2)
    for key in ("all", "root_ablated"):
        acc = doc[key]["offset_accuracy"]
        assert len(acc) == 15 and all(0 <= a <= 1 for a in acc)
        assert 1 <= doc[key]["chain_accepted_length"] <= 16
    # the engine's rounds are the walk over the training forward's per-anchor hits, exactly
    assert doc["engine_chain"]["identical_to_ar"] == 5
    assert (doc["walk"]["tokens"], doc["walk"]["rounds"]) == (doc["engine_chain"]["tokens"], doc["engine_chain"]["rounds"])
