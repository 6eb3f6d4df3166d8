"""Best-first expansion (`drafters/best_first.py`) against a row-by-row reference written from its
docstring: the candidates (tokens, path scores, parents) and, level by level, the frontier's
positions, cache slots and masks (committed slots + the tree-region slots of its ancestors and
itself). The stand-in step's logits depend on the mask, the positions and the slots, so any of them
being wrong changes the candidates."""

import pytest
import torch

from specpilot.engine.drafters import best_first

V, CAPACITY = 50, 40


class Step:
    """Logits [B,k,V] from the node's token, its position, its slot and the slots it sees."""

    def __init__(self, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(V, V, generator=g) * 3
        self.slot_w = torch.randn(CAPACITY, V, generator=g)
        self.pos_w = torch.randn(CAPACITY + 8, V, generator=g)
        self.calls = []

    def __call__(self, tokens, carry, pos, slots, mask):
        self.calls.append((pos.clone(), slots.clone(), mask.clone()))
        seen = mask[:, 0].float() @ self.slot_w  # [B,k,V]
        return self.table[tokens] + 0.3 * seen + self.pos_w[pos] + 0.5 * self.slot_w[slots], None


def reference(root_logits, step, depth, k, base):
    """Per row: candidate tokens, scores, parents, and per level the (positions, slots, mask rows)."""
    B = root_logits.shape[0]
    tree_slots = max(depth - 1, 1) * k
    out = []
    for b in range(B):
        lp = torch.log_softmax(root_logits[b].float(), -1)
        s, i = lp.topk(k)
        toks, scores, parents = i.tolist(), s.tolist(), [-1] * k
        # frontier: (candidate id, token, score, region slots of its ancestors and itself)
        frontier = [(j, toks[j], scores[j], set()) for j in range(k)]
        levels = []
        for d in range(1, depth):
            for j, node in enumerate(frontier):
                node[3].add((d - 1) * k + j)
            pos = [int(base[b]) - 1 + d] * k
            slots = [min(int(base[b]) + (d - 1) * k + j, CAPACITY - 1) for j in range(k)]
            mask = torch.zeros(k, CAPACITY, dtype=torch.bool)
            for j, node in enumerate(frontier):
                for sl in range(CAPACITY):
                    rel = sl - int(base[b])
                    mask[j, sl] = sl < int(base[b]) or (0 <= rel < tree_slots and rel in node[3])
            levels.append((pos, slots, mask))
            logits = step.table[torch.tensor([n[1] for n in frontier])] + 0.3 * (mask.float() @ step.slot_w) \
                + step.pos_w[torch.tensor(pos)] + 0.5 * step.slot_w[torch.tensor(slots)]
            children = []
            for j, node in enumerate(frontier):
                c_lp, c_idx = torch.log_softmax(logits[j].float(), -1).topk(k)
                for lpv, t in zip(c_lp.tolist(), c_idx.tolist()):
                    children.append((len(toks), t, node[2] + lpv, node))
                    toks.append(t)
                    scores.append(node[2] + lpv)
                    parents.append(node[0])
            best = sorted(range(len(children)), key=lambda c: -children[c][2])[:k]  # stable
            frontier = [(children[c][0], children[c][1], children[c][2], set(children[c][3][3])) for c in best]
        out.append((toks, scores, parents, levels))
    return out


@pytest.mark.parametrize("compiling", [False, True], ids=["cached-constants", "constants-each-call"])
@pytest.mark.parametrize("depth,k", [(6, 4), (3, 2), (1, 3), (4, 1)])
def test_expansion_equals_the_reference(monkeypatch, depth, k, compiling):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)  # traced: constants made in the call
    B = 3
    g = torch.Generator().manual_seed(depth * 10 + k)
    root_logits = torch.randn(B, V, generator=g) * 3
    base = torch.tensor([5, 0, 17])
    captured = {}

    def select(roots, tokens, scores, parents, *args, **kw):
        captured.update(tokens=tokens, scores=scores, parents=parents)

    monkeypatch.setattr(best_first, "select", select)
    step = Step(seed=k)
    best_first.expand(torch.zeros(B, dtype=torch.int64), root_logits, step, depth, k, budget=4, base=base,
                      capacity=CAPACITY)
    for b, (toks, scores, parents, levels) in enumerate(reference(root_logits, Step(seed=k), depth, k, base)):
        assert captured["tokens"][b].tolist() == toks
        assert captured["parents"][b].tolist() == parents
        torch.testing.assert_close(captured["scores"][b], torch.tensor(scores), rtol=0, atol=1e-5)
        assert len(step.calls) == len(levels) == depth - 1
        for (pos, slots, mask), (want_pos, want_slots, want_mask) in zip(step.calls, levels):
            assert pos[b].tolist() == want_pos and slots[b].tolist() == want_slots
            assert torch.equal(mask[b, 0], want_mask)
