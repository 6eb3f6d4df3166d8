"""`draft_compile` and `verify_compile`: a round's proposal and verification under torch.compile
give the tokens and acceptance of the eager round. On CPU the knobs are inert with the inductor
backend; the tests trace with Dynamo through a counting backend that runs the captured graphs as
they are."""

import dataclasses

import pytest
import torch

from specpilot.config import Deployment, DrafterKind, Kernel, System
from specpilot.engine.session import Session
from specpilot.models import ops
from specpilot.models.eagle3 import random_eagle3
from specpilot.models.eagle3_checkpoint import write_eagle3
from specpilot.models.loading import load_model


@pytest.fixture
def traced(monkeypatch):
    """Graphs Dynamo captured, per compiled function name."""
    graphs: list = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    monkeypatch.setattr(ops, "STATIC_BACKEND", backend)
    torch._dynamo.reset()
    yield graphs
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def eagle3_dir(target_dir, tmp_path_factory):
    target = load_model(target_dir)
    out = tmp_path_factory.mktemp("eagle3") / "e"
    return write_eagle3(random_eagle3(target.config, seed=5), out, dtype=torch.float32)


def _generate(session, system, prompts):
    result = session.generator(system).generate(prompts, 24)
    return result.outputs, result.accept_lengths


@pytest.mark.parametrize("knobs", [{"draft_compile": True}, {"verify_compile": True},
                                   {"draft_compile": True, "verify_compile": True}])
@pytest.mark.parametrize("drafter", ["model", "eagle3"])
def test_compiled_round_pieces_give_the_eager_rounds_tokens_and_acceptance(traced, target_dir, drafter_dir,
                                                                           eagle3_dir, make_prompts, drafter, knobs):
    stock = System(drafter=DrafterKind(drafter), depth=4, topk=3, tree_budget=10)
    directory = drafter_dir if drafter == "model" else eagle3_dir
    dep = Deployment(name="c", target=str(target_dir), drafter=str(directory), stock=stock)
    session = Session.load(dep, device="cpu", dtype=torch.float32)
    prompts = make_prompts(3)
    eager = _generate(session, stock, prompts)
    assert not traced
    compiled = _generate(session, dataclasses.replace(stock, name="compiled", **knobs), prompts)
    assert traced  # the knobs' functions ran under Dynamo
    assert compiled == eager


def test_with_inductor_on_cpu_the_knobs_leave_the_plain_functions():
    def f(x):
        return x + 1

    assert ops.STATIC_BACKEND == "inductor" and ops.compiled_static(f, torch.device("cpu")) is f


def test_verify_compile_refuses_the_triton_kernels():
    from specpilot.errors import ConfigError

    with pytest.raises(ConfigError, match="verify_compile needs kernel = 'cublas'"):
        System(verify_compile=True, kernel=Kernel.TRITON)
    assert System(draft_compile=True, kernel=Kernel.TRITON, w12=True).draft_compile


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
