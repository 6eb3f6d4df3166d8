"""scripts/attention_kernels.py on CPU: the tree masks it times and its table (the timing needs a GPU)."""

import torch


def test_the_mask_is_the_prompt_then_a_tree_whose_nodes_see_their_ancestors(bench_script):
    s = bench_script("attention_kernels")
    mask = s.tree_mask(2, 6, 64, 20, "cpu")  # [B,1,T,S]
    assert mask.shape == (2, 1, 6, 64) and torch.equal(mask[0], mask[1])
    assert mask[..., :20].all() and not mask[..., 26:].any()
    tree = mask[0, 0, :, 20:26]
    assert torch.equal(tree.diagonal(), torch.ones(6, dtype=torch.bool)) and tree[:, 0].all()  # itself; the root
    assert not tree.triu(1).any()  # no node sees a later one
    for i in range(1, 6):  # a node sees exactly its parent's ancestors and itself
        parent = max(j for j in range(i) if tree[i, j])
        assert torch.equal(tree[i, :i], tree[parent, :i])


def test_the_table_gives_each_arm_and_the_default_over_split_ratio(bench_script, tmp_path):
    s = bench_script("attention_kernels")
    arms = list(s.ARMS)
    assert arms[0] == "sdpa (default)" and arms[-1] == "split-KV triton"
    us = dict(zip(arms, [14.0, 14.0, 20.0, 30.0, 4.0]))
    del us[arms[1]]  # a backend that refused the shape
    row = {"name": "verify", "B": 1, "T": 65, "H": 64, "Hkv": 32, "D": 64, "S": 1024, "us": us,
           "max_abs_error": {a: 1e-3 for a in us}, "failed": {arms[1]: "RuntimeError: no"},
           "split_plan": {"block_m": 64, "chunk": 384, "n_split": 3}}
    doc = {"date": "d", "rounds": 3, "shapes": [row],
           "environment": {"gpu": "H200", "git_commit": "abc", "git_dirty": False, "versions": {"torch": "x"}}}
    s.write_md(doc, tmp_path / "a.md")
    text = (tmp_path / "a.md").read_text()
    assert "| verify | 1 | 65 | 64/32 | 64 | 1024 | 14.0 | refused | 20.0 | 30.0 | 4.0 | 3 x 384 keys, 64 rows | 3.50x |" in text
    assert "| verify | 1.00e-03 | - | 1.00e-03 | 1.00e-03 | 1.00e-03 |" in text
    assert f"- verify, {arms[1]}: RuntimeError: no" in text
