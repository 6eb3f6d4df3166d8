"""Exactness of sampled acceptance, statistically: over S independent rows (seeds), the first emitted
token, and the first two, of chains and trees drafted each way follow the target's processed
distribution (a chi-square test passes), and each injected fault is caught (it fails).

The world is a fixed small vocabulary: the target's and the drafter's next-token logits after the
empty context and after each first token. The second token comes from the same round when the
first was an accepted draft, else from a next round (a one-child chain at the emitted token).
"""

from dataclasses import replace

import pytest
import torch
from scipy.stats import chisquare

from specpilot.engine.acceptance_sampling import (
    DraftKind, SamplingFault, draw_uniforms, duplicate_siblings, point_mass_accept, sampled_accept,
)
from specpilot.engine.sampling import SamplingParams, process_logits
from specpilot.engine.tree import DraftTree
from specpilot.engine.verify import greedy_accept

S = 100_000  # rows (independent samples)
PARAMS = SamplingParams(0.9, top_k=5, top_p=0.95)  # one request's settings, both sides
EXACT = 1e-3  # an exact rule passes above this p-value (fixed seeds: the outcome is deterministic)
CAUGHT = 1e-6  # a fault fails below this one


class World:
    """Target and drafter logits for the first token [V] and the second after each first [V,V]."""

    def __init__(self, V: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.V = V
        self.target1 = torch.randn(V, generator=g) * 1.2
        self.target2 = torch.randn(V, V, generator=g) * 1.2
        self.draft1 = self.target1 + torch.randn(V, generator=g)  # a close, imperfect drafter
        self.draft2 = self.target2 + torch.randn(V, V, generator=g)

    def p(self, params=PARAMS):
        return process_logits(self.target1, params), process_logits(self.target2, params)  # [V], [V,V]

    def q(self, params=PARAMS):
        return process_logits(self.draft1, params), process_logits(self.draft2, params)


def draft_children(q: torch.Tensor, m: int, kind: DraftKind, g: torch.Generator) -> torch.Tensor:
    """q [B,V] -> [B,m] children of one node, in the order they are tried."""
    if kind is DraftKind.SAMPLED:
        return torch.multinomial(q, m, replacement=True, generator=g)
    if kind is DraftKind.WITHOUT_REPLACEMENT:  # Gumbel top-m: sequential draws without replacement
        gumbel = -torch.log(-torch.log(torch.rand(q.shape, generator=g).clamp(min=1e-20)))
        return (q.log() + gumbel).topk(m, dim=-1).indices
    return q.topk(m, dim=-1).indices  # POINT_MASS: the drafter's top-m


def two_level_tree(world, p, q, kind, widths, g):
    """A tree of `widths = (m1, m2)` (m2 = 0: depth 1) drafted per row: tokens, parents,
    target_probs, draft_probs. Nodes after depth 1 see a uniform target (their bonus is unused)."""
    (p1, p2), (q1, q2) = p, q
    m1, m2 = widths
    V = world.V
    root = torch.zeros(S, dtype=torch.long)
    first = draft_children(q1.expand(S, V), m1, kind, g)  # [S,m1]
    tokens, parents = [root[:, None], first], [-1] + [0] * m1
    tprobs = [p1.expand(S, 1, V), p2[first]]  # [S,1+m1,V]
    dprobs = [q1.expand(S, 1, V), q2[first]]
    if m2:
        second = torch.stack([draft_children(q2[first[:, i]], m2, kind, g) for i in range(m1)], 1)  # [S,m1,m2]
        tokens.append(second.reshape(S, m1 * m2))
        parents += [1 + i for i in range(m1) for _ in range(m2)]
        uniform = torch.full((S, m1 * m2, V), 1.0 / V)
        tprobs.append(uniform)
        dprobs.append(uniform)
    tree = DraftTree(torch.cat(tokens, 1), torch.tensor(parents).expand(S, -1), max_depth=2 if m2 else 1)
    return tree, torch.cat(tprobs, 1), torch.cat(dprobs, 1)


def first_two(world, kind, widths, seed=0, fault=None, p=None, q=None):
    """[S] first tokens and [S] second tokens emitted (round 1, then round 2 where needed)."""
    g = torch.Generator().manual_seed(seed)
    p = p or world.p()
    q = q or world.q()
    tree, tprobs, dprobs = two_level_tree(world, p, q, kind, widths, g)
    u_accept, u_final = draw_uniforms(S, tree.num_nodes, g)
    acc = sampled_accept(tree, tprobs, u_accept, u_final, dprobs, kind, fault)
    t1 = acc.new_tokens[:, 0]
    # Round 2 for rows that emitted one token: one child drafted at context (t1).
    tree2, tprobs2, dprobs2 = _second_round(world, p, q, kind, t1, g)
    u_accept2, u_final2 = draw_uniforms(S, 2, g)
    acc2 = sampled_accept(tree2, tprobs2, u_accept2, u_final2, dprobs2, kind, fault)
    t2 = torch.where(acc.accept_len >= 1, acc.new_tokens[:, 1], acc2.new_tokens[:, 0])
    return t1, t2, acc


def _second_round(world, p, q, kind, t1, g):
    V = world.V
    child = draft_children(q[1][t1], 1, kind, g)  # [S,1]
    tree = DraftTree.chain(torch.cat([t1[:, None], child], 1))
    uniform = torch.full((S, 1, V), 1.0 / V)
    return tree, torch.cat([p[1][t1][:, None], uniform], 1), torch.cat([q[1][t1][:, None], uniform], 1)


def pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square goodness of fit of samples [S] in [0,C) to probs [C]; cells expected below 5 are
    pooled; any sample in a cell of probability 0 gives 0."""
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    if counts[probs == 0].sum() > 0:
        return 0.0
    expected = probs.double() / probs.sum() * counts.sum()
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)


def joint(world, p=None):
    p1, p2 = p or world.p()
    return (p1[:, None] * p2).reshape(-1)  # [V*V] over (t1, t2)


SHAPES = {"chain-1": (1, 0), "tree-4": (4, 0), "chain-2": (1, 1), "tree-3x2": (3, 2)}


@pytest.mark.parametrize("kind", list(DraftKind), ids=lambda k: k.value)
@pytest.mark.parametrize("shape", SHAPES)
def test_the_exact_rule_emits_the_target_distribution(kind, shape):
    world = World(V=7)
    t1, t2, acc = first_two(world, kind, SHAPES[shape])
    assert pvalue(t1, world.p()[0]) > EXACT
    assert pvalue(t1 * world.V + t2, joint(world)) > EXACT
    assert acc.accept_len.float().mean() > 0.3  # the drafter is close: drafts are accepted


def test_chain_acceptance_is_the_overlap_of_p_and_q():
    world = World(V=10)
    (p1, _), (q1, _) = world.p(), world.q()
    _, _, acc = first_two(world, DraftKind.SAMPLED, (1, 0))
    rate = (acc.accept_len >= 1).double().mean().item()
    expected = torch.minimum(p1, q1).sum().item()  # Leviathan et al.: alpha = sum min(p, q)
    assert abs(rate - expected) < 4 * (expected * (1 - expected) / S) ** 0.5
    _, _, acc = first_two(world, DraftKind.POINT_MASS, (1, 0))
    rate = (acc.accept_len >= 1).double().mean().item()
    expected = p1[q1.argmax()].item()  # a point mass is accepted with p(x)
    assert abs(rate - expected) < 4 * (expected * (1 - expected) / S) ** 0.5


def best_first_tree(q1, q2, m1: int, budget: int):
    """Deterministic node set from draft probabilities: the top-m1 first tokens, then the `budget`
    second-level paths of highest q1(a) q2(b|a) among them (so the widths differ per node)."""
    first = q1.topk(m1).indices.tolist()
    scored = sorted(((q1[a] * q2[a, b]).item(), i, b) for i, a in enumerate(first) for b in range(len(q1)))
    chosen = sorted((i, b) for _, i, b in scored[-budget:])
    tokens = [0] + first + [b for _, b in chosen]
    parents = [-1] + [0] * m1 + [1 + i for i, _ in chosen]
    return tokens, parents


def test_best_first_trees_are_exact_as_point_masses():
    world = World(V=7)
    (p1, p2), (q1, q2) = world.p(), world.q()
    tokens, parents = best_first_tree(q1, q2, m1=3, budget=5)
    assert [parents.count(i) for i in (1, 2, 3)] == [3, 1, 1]  # widths chosen by q, uneven
    N, V = len(tokens), world.V
    tok = torch.tensor(tokens).expand(S, N)
    tree = DraftTree(tok, torch.tensor(parents).expand(S, N), max_depth=2)
    depth1 = tok[:, 1:4]
    tprobs = torch.cat([p1.expand(S, 1, V), p2[depth1], torch.full((S, N - 4, V), 1.0 / V)], 1)
    g = torch.Generator().manual_seed(5)
    u_accept, u_final = draw_uniforms(S, N, g)
    acc = sampled_accept(tree, tprobs, u_accept, u_final, kind=DraftKind.POINT_MASS)
    t1 = acc.new_tokens[:, 0]
    t2_next_round = torch.multinomial(p2[t1], 1, generator=g)[:, 0]  # an AR next round: exact by definition
    t2 = torch.where(acc.accept_len >= 1, acc.new_tokens[:, 1], t2_next_round)
    assert pvalue(t1, p1) > EXACT
    assert pvalue(t1 * V + t2, joint(world)) > EXACT
    # Both levels of drafts are used, so the depth-2 part of the rule is exercised.
    assert (acc.accept_len == 2).float().mean() > 0.2


def test_sampled_drafts_verified_as_point_masses_stay_exact():
    world = World(V=7)
    g = torch.Generator().manual_seed(2)
    tree, tprobs, _ = two_level_tree(world, world.p(), world.q(), DraftKind.SAMPLED, (3, 2), g)
    acc = sampled_accept(tree, tprobs, *draw_uniforms(S, tree.num_nodes, g), kind=DraftKind.POINT_MASS)
    assert pvalue(acc.new_tokens[:, 0], world.p()[0]) > EXACT


@pytest.mark.parametrize("fault", list(SamplingFault), ids=lambda f: f.value)
@pytest.mark.parametrize("kind,shape", [(DraftKind.SAMPLED, "chain-1"), (DraftKind.SAMPLED, "tree-3x2"),
                                        (DraftKind.WITHOUT_REPLACEMENT, "tree-4"), (DraftKind.POINT_MASS, "tree-4")])
def test_a_broken_rule_is_caught(fault, kind, shape):
    world = World(V=7)
    t1, _, _ = first_two(world, kind, SHAPES[shape], fault=fault)
    assert pvalue(t1, world.p()[0]) < CAUGHT


@pytest.mark.parametrize("kind", list(DraftKind), ids=lambda k: k.value)
def test_the_drafts_temperature_applied_to_the_target_is_caught(kind):
    world = World(V=7)
    draft_params = replace(PARAMS, temperature=0.5)  # the drafter runs colder than the request
    t1, _, _ = first_two(world, kind, (3, 2), p=world.p(draft_params), q=world.q(draft_params))
    assert pvalue(t1, world.p()[0]) < CAUGHT


@pytest.mark.parametrize("kind", list(DraftKind), ids=lambda k: k.value)
def test_top_p_on_one_side_only(kind):
    """Left off the target: caught. Left off the drafter only: still exact (the rule holds for any q)."""
    world = World(V=7)
    no_top_p = replace(PARAMS, top_p=1.0)
    t1, _, _ = first_two(world, kind, (3, 2), p=world.p(no_top_p))
    assert world.p(no_top_p)[0].count_nonzero() > world.p()[0].count_nonzero()  # top-p matters here
    assert pvalue(t1, world.p()[0]) < CAUGHT
    t1, t2, _ = first_two(world, kind, (3, 2), q=world.q(no_top_p))
    assert pvalue(t1 * world.V + t2, joint(world)) > EXACT


def test_with_a_point_mass_target_it_is_greedy_acceptance():
    """Temperature 0 makes p one-hot: every kind accepts exactly what `greedy_accept` accepts."""
    B, V = 512, 5
    g = torch.Generator().manual_seed(4)
    parents = torch.tensor([-1, 0, 0, 0, 1, 1, 2, 3, 3, 4])  # siblings carry distinct tokens
    N = len(parents)
    tokens = torch.zeros(B, N, dtype=torch.long)
    for parent in range(N):
        kids = (parents == parent).nonzero()[:, 0]
        if len(kids):
            tokens[:, kids] = torch.rand(B, V, generator=g).argsort(-1)[:, :len(kids)]
    argmax = torch.randint(0, V, (B, N), generator=g)
    argmax[:, 0] = tokens[:, 1]  # most rows accept the first level
    p = torch.nn.functional.one_hot(argmax, V).float()  # [B,N,V]
    q = torch.softmax(torch.randn(B, N, V, generator=g), -1)
    budget = torch.randint(1, N + 1, (B, 1), generator=g)
    for valid in (None, torch.arange(N)[None, :] < budget):  # a shared budget: the first nodes of each row
        tree = DraftTree(tokens, parents.expand(B, N), max_depth=3, valid=valid)
        want = greedy_accept(tree, argmax)
        for kind in DraftKind:
            got = sampled_accept(tree, p, *draw_uniforms(B, N, g), draft_probs=q, kind=kind)
            assert torch.equal(got.accept_len, want.accept_len)
            assert torch.equal(got.path, want.path) and torch.equal(got.bonus, want.bonus)
            assert torch.equal(got.new_tokens, want.new_tokens)
        assert want.accept_len.float().mean() > 0.5


@pytest.mark.parametrize("drafts", ["best-first", "sampled-with-repeats"])
def test_the_one_pass_point_mass_rule_emits_the_target_distribution(drafts):
    """`point_mass_accept` (one draw per node, then greedy matching, repeated siblings never
    accepted) has the sequential rule's law: on a best-first tree, and on a tree whose i.i.d. drafted
    children repeat tokens (without the repeat mask the first two tokens' law is off)."""
    world = World(V=7)
    (p1, p2), (q1, q2) = world.p(), world.q()
    V = world.V
    g = torch.Generator().manual_seed(7)
    if drafts == "best-first":
        tokens, parents = best_first_tree(q1, q2, m1=3, budget=5)
        tok = torch.tensor(tokens).expand(S, len(tokens))
        tree = DraftTree(tok, torch.tensor(parents).expand(S, -1), max_depth=2)
        tprobs = torch.cat([p1.expand(S, 1, V), p2[tok[:, 1:4]], torch.full((S, len(tokens) - 4, V), 1.0 / V)], 1)
    else:
        tree, tprobs, _ = two_level_tree(world, world.p(), world.q(), DraftKind.SAMPLED, (3, 2), g)
        assert duplicate_siblings(tree).any(1).float().mean() > 0.3
    u, _ = draw_uniforms(S, tree.num_nodes, g)
    acc = point_mass_accept(tree, tprobs, u)
    t1 = acc.new_tokens[:, 0]
    t2 = torch.where(acc.accept_len >= 1, acc.new_tokens[:, 1], torch.multinomial(p2[t1], 1, generator=g)[:, 0])
    assert pvalue(t1, p1) > EXACT
    assert pvalue(t1 * V + t2, joint(world)) > EXACT
    assert (acc.accept_len == 2).float().mean() > 0.1
    if drafts != "best-first":  # the same tree matched without the repeat mask: biased
        y = torch.stack([torch.multinomial(tprobs[:, j], 1, generator=g)[:, 0] for j in range(tree.num_nodes)], 1)
        naive = greedy_accept(tree, y)
        n1 = naive.new_tokens[:, 0]
        n2 = torch.where(naive.accept_len >= 1, naive.new_tokens[:, 1], torch.multinomial(p2[n1], 1, generator=g)[:, 0])
        assert pvalue(n1 * V + n2, joint(world)) < CAUGHT
