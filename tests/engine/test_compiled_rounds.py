"""`draft_compile` and `verify_compile`: a round's proposal and verification under torch.compile
give the tokens and acceptance of the eager round. On CPU the knobs are inert with the inductor
backend; the tests trace with Dynamo through a counting backend that runs the captured graphs as
they are. The Triton projections run under Triton's interpreter on CPU."""

import dataclasses

import pytest
import torch

from specpilot.config import AttentionKernel, Deployment, DrafterKind, Kernel, System
from specpilot.engine.session import Session
from specpilot.models import ops
from specpilot.models.eagle3 import random_eagle3
from specpilot.models.dflash import random_dflash
from specpilot.models.dflash_checkpoint import write_dflash
from specpilot.models.eagle3_checkpoint import write_eagle3
from specpilot.models.loading import load_model

@pytest.fixture(scope="module")
def eagle3_dir(target_dir, tmp_path_factory):
    target = load_model(target_dir)
    out = tmp_path_factory.mktemp("eagle3") / "e"
    return write_eagle3(random_eagle3(target.config, seed=5), out, dtype=torch.float32)


@pytest.fixture(scope="module")
def dflash_dir(target_dir, tmp_path_factory):
    target = load_model(target_dir)
    out = tmp_path_factory.mktemp("dflash") / "d"
    return write_dflash(random_dflash(target.config, num_layers=1, block_size=6, mask_token_id=3, seed=4), out,
                        dtype=torch.float32)


@pytest.fixture
def drafting_with(target_dir, drafter_dir, eagle3_dir, dflash_dir):
    """(stock system, deployment) drafting with `kind`: the draft model, EAGLE-3 or DFlash."""
    directories = {"model": drafter_dir, "eagle3": eagle3_dir, "dflash": dflash_dir}

    def make(kind: str):
        stock = System(drafter=DrafterKind(kind), depth=4, topk=3, tree_budget=10, block_size=6)
        return stock, Deployment(name="c", target=str(target_dir), drafter=str(directories[kind]), stock=stock)

    return make


def _generate(session, system, prompts):
    result = session.generator(system).generate(prompts, 24)
    return result.outputs, result.accept_lengths


@pytest.mark.parametrize("knobs", [{"draft_compile": True}, {"verify_compile": True},
                                   {"draft_compile": True, "verify_compile": True}])
@pytest.mark.parametrize("drafter", ["model", "eagle3", "dflash"])
def test_compiled_round_pieces_give_the_eager_rounds_tokens_and_acceptance(traced, drafting_with, make_prompts, drafter,
                                                                           knobs):
    stock, dep = drafting_with(drafter)
    session = Session.load(dep, device="cpu", dtype=torch.float32)
    prompts = make_prompts(3)
    eager = _generate(session, stock, prompts)
    assert not traced
    compiled = _generate(session, dataclasses.replace(stock, name="compiled", **knobs), prompts)
    assert traced  # the knobs' functions ran under Dynamo
    assert compiled == eager


@pytest.mark.parametrize("drafter", ["model", "eagle3", "dflash"])
def test_the_proposal_and_the_verification_each_trace_as_one_graph(drafting_with, make_prompts, monkeypatch, drafter):
    """On the CUDA path (fused elementwise ops on) neither compiled piece breaks its graph: a break
    per forward left most of a proposal outside the compiled graph."""
    from specpilot.engine.steps import verify_step

    stock, dep = drafting_with(drafter)
    gen = Session.load(dep, device="cpu", dtype=torch.float32).generator(stock)
    gen.generate(make_prompts(1), 8)
    ws = next(reversed(gen.workspaces.values()))
    proposer = next(iter(gen.drafters.values()))
    with torch.inference_mode():
        tree = proposer.propose(ws.state)
    monkeypatch.setattr(ops, "fusion_enabled", lambda device: True)  # what a forward asks `ops.fused` on CUDA
    torch._dynamo.reset()
    with torch.inference_mode():
        proposal = torch._dynamo.explain(proposer._proposal)(ws.state)
        verification = torch._dynamo.explain(verify_step)(gen.target, ws.cache, ws.state, tree, None, segment=0)
    torch._dynamo.reset()
    assert (proposal.graph_count, proposal.graph_break_count) == (1, 0)
    assert (verification.graph_count, verification.graph_break_count) == (1, 0)


def test_with_inductor_on_cpu_the_knobs_leave_the_plain_functions():
    def f(x):
        return x + 1

    assert ops.STATIC_BACKEND == "inductor" and ops.compiled_static(f, torch.device("cpu")) is f


@pytest.mark.parametrize("w12", [False, True])
def test_verify_compile_over_the_triton_projections_gives_the_eager_tokens(traced, interpreted_kernels, bf16_dirs,
                                                                           make_prompts, w12):
    """The compiled verification is one graph (no break at the projections) that calls each swapped
    projection as one `specpilot::linear` op, and it commits the eager rounds' tokens and acceptance."""
    stock = System(drafter=DrafterKind.MODEL, depth=2, topk=2, tree_budget=4, kernel=Kernel.TRITON, w12=w12)
    target, drafter = bf16_dirs
    dep = Deployment(name="k", target=str(target), drafter=str(drafter), stock=stock)
    session = Session.load(dep, device="cpu", dtype=torch.float32)
    prompts = make_prompts(1, seed=2, lo=4, hi=8)
    eager = session.generator(stock).generate(prompts, 5)
    assert not traced
    compiled = session.generator(dataclasses.replace(stock, name="compiled", verify_compile=True)).generate(prompts, 5)
    projections = [n for gm in traced for n in gm.graph.nodes
                   if n.op == "call_function" and n.target in (torch.ops.specpilot.linear,
                                                               torch.ops.specpilot.linear.default)]
    assert len(traced) == 1 and len(projections) == 2 * 4  # every block projection (the lm_head is cuBLAS)
    assert (compiled.outputs, compiled.accept_lengths) == (eager.outputs, eager.accept_lengths)


def test_knobs_set_away_from_default_change_the_fingerprint_and_default_ones_do_not():
    stock = System()
    assert dataclasses.replace(stock, draft_compile=False).fingerprint() == stock.fingerprint()
    assert dataclasses.replace(stock, draft_compile=True).fingerprint() != stock.fingerprint()
    assert dataclasses.replace(stock, verify_compile=True).fingerprint() != stock.fingerprint()


def test_served_by_continuous_batching_the_compiled_rounds_give_each_requests_ar_tokens(traced, target_dir,
                                                                                        drafter_dir):
    from specpilot.engine.drafters.draft_model import DraftModelDrafter
    from specpilot.engine.generator import Generator
    from specpilot.engine.serving import Request, ServingEngine

    target, draft = load_model(target_dir), load_model(drafter_dir)
    g = torch.Generator().manual_seed(3)
    requests = [Request(tuple(torch.randint(1, 4096, (int(n),), generator=g).tolist()), max_new=12)
                for n in torch.randint(2, 40, (5,), generator=g)]
    ar = [Generator(target).generate([list(r.prompt)], r.max_new).outputs[0] for r in requests]
    compiled = Generator(target, {4: DraftModelDrafter(draft, 4, 2, 6, compiled=True)}, verify_compile=True)
    result = ServingEngine(compiled, 2, prefill_chunk=16).run(requests)
    assert traced and [r.output for r in result.requests] == ar


def test_compiled_rounds_over_split_attention_call_the_op_and_give_the_eager_tokens(traced, interpreted_kernels,
                                                                                   drafting_with, make_prompts):
    """`attention = "split_kv"` under both compile knobs: each piece is one graph that calls the
    split-KV kernel as one `specpilot::split_attention` op per cached attention, and the rounds commit
    the eager rounds' tokens and acceptance."""
    stock, dep = drafting_with("model")
    split = dataclasses.replace(stock, name="split", attention=AttentionKernel.SPLIT_KV)
    session = Session.load(dep, device="cpu", dtype=torch.float32)
    prompts = make_prompts(1, seed=2, lo=4, hi=8)
    eager = session.generator(split).generate(prompts, 5)
    assert not traced
    both = dataclasses.replace(split, name="compiled", draft_compile=True, verify_compile=True)
    compiled = session.generator(both).generate(prompts, 5)
    ops_per_graph = sorted(sum(n.op == "call_function" and n.target in (torch.ops.specpilot.split_attention,
                                                                      torch.ops.specpilot.split_attention.default)
                               for n in gm.graph.nodes) for gm in traced)
    layers = session.target.config.num_layers, session.drafter_model.config.num_layers
    assert ops_per_graph == sorted([layers[0], layers[1] * stock.depth])  # verification; the proposal's draft steps
    assert (compiled.outputs, compiled.accept_lengths) == (eager.outputs, eager.accept_lengths)


def test_verify_compile_without_a_drafter_compiles_the_ar_step_and_gives_its_tokens(traced, target_dir, drafter_dir,
                                                                                    make_prompts):
    """AR under verify_compile: its step (forward, argmax, commit) is the compiled function, and the
    tokens are eager AR's, for rows of different prompt lengths."""
    ar = System(drafter=DrafterKind.NONE)
    session = Session.load(Deployment(name="a", target=str(target_dir), drafter=str(drafter_dir), stock=ar),
                           device="cpu", dtype=torch.float32)
    prompts = make_prompts(3, seed=5)
    eager = session.generator(ar).generate(prompts, 12).outputs
    assert not traced
    compiled = session.generator(dataclasses.replace(ar, name="compiled", verify_compile=True)).generate(prompts, 12)
    assert len(traced) == 1  # one graph: the AR step, captured once and replayed
    assert compiled.outputs == eager


def test_the_ar_step_traces_as_one_graph(target_dir, make_prompts, monkeypatch):
    """On the CUDA path (fused elementwise ops on) the AR step does not break its graph."""
    from specpilot.engine.generator import Generator
    from specpilot.engine.steps import ar_step

    gen = Generator(load_model(target_dir))
    gen.generate(make_prompts(2), 4)
    ws = next(reversed(gen.workspaces.values()))
    monkeypatch.setattr(ops, "fusion_enabled", lambda device: True)
    torch._dynamo.reset()
    with torch.inference_mode():
        explained = torch._dynamo.explain(ar_step)(gen.target, ws.cache, ws.state, None)
    torch._dynamo.reset()
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
