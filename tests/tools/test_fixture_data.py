"""Held-out split, EOS-separated encoding and mixture sampling."""

import torch
from fixture_data import EOS_ID, TokenData, encode, split_heldout, windows


def test_split_is_deterministic_and_disjoint():
    docs = {"a": [f"doc {i}" for i in range(100)], "b": [f"other {i}" for i in range(10)]}
    train, held = split_heldout(docs, fraction=0.05, min_docs=3, seed=0)
    assert (train, held) == split_heldout(docs, fraction=0.05, min_docs=3, seed=0)
    assert len(held["a"]) == 5 and len(held["b"]) == 3
    for s in docs:
        assert sorted(train[s] + held[s]) == sorted(docs[s])
        assert not set(train[s]) & set(held[s])


class FakeEncoding:
    def __init__(self, ids):
        self.ids = ids


class FakeTokenizer:
    def encode_batch(self, docs, add_special_tokens=False):
        return [FakeEncoding([len(d)] * len(d)) for d in docs]


def test_encode_appends_eos():
    stream = encode(FakeTokenizer(), ["ab", "xyz"])
    assert stream.tolist() == [2, 2, EOS_ID, 3, 3, 3, EOS_ID]


def test_batches_stay_inside_one_source():
    streams = {"low": torch.arange(1, 101, dtype=torch.int32), "high": torch.arange(1000, 1300, dtype=torch.int32)}
    data = TokenData.build(streams, {"low": 1.0, "high": 1.0}, min_len=20, device="cpu")
    x = data.batch(64, 16, torch.Generator().manual_seed(0))
    assert x.shape == (64, 17)
    for row in x:
        assert (row < 1000).all() or (row >= 1000).all()
        assert torch.equal(row[1:] - row[:-1], torch.ones(16, dtype=torch.int64))  # consecutive tokens
    assert abs(data.weights[0].item() - 0.25) < 1e-12  # 100 vs 300 tokens


def test_windows_cover_the_stream():
    ws = windows(torch.arange(10), 4)
    assert [w.tolist() for w in ws] == [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8], [8, 9]]
