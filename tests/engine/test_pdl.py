"""`pdl = true`: every launch of the system's generator (its rounds, prefills, a served run, the
profile of its pieces) runs inside `kernels.launch.pdl_scope(True)`; the knob changes no
arithmetic, so the tokens are those without it. (Whether the kernels then launch with PDL is
`launch.pdl`'s decision per device: never on CPU; the GPU tests run it.)"""

import dataclasses

import pytest
import torch

from specpilot.config import Deployment, DrafterKind, System
from specpilot.engine.session import Session
from specpilot.kernels import launch


def _session(target_dir, drafter_dir):
    stock = System(drafter=DrafterKind.MODEL, depth=3, topk=2, tree_budget=5)
    return Session.load(Deployment(name="p", target=str(target_dir), drafter=str(drafter_dir), stock=stock),
                        device="cpu", dtype=torch.float32), stock


@pytest.fixture
def seen(monkeypatch):
    """The PDL scope of every Transformer forward from here on."""
    from specpilot.models import transformer

    scopes: list = []
    forward = transformer.Transformer.forward

    def recording(self, *args, **kwargs):
        scopes.append(launch._scope.get())
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(transformer.Transformer, "forward", recording)
    return scopes


def test_the_knob_runs_every_forward_in_the_pdl_scope_and_changes_no_token(target_dir, drafter_dir, make_prompts,
                                                                           seen):
    session, stock = _session(target_dir, drafter_dir)
    prompts = make_prompts(2, seed=3)
    plain = session.generator(stock).generate(prompts, 10)
    assert seen and set(seen) == {None}  # without the knob: SPECPILOT_PDL decides
    seen.clear()
    pdl = dataclasses.replace(stock, name="pdl", pdl=True)
    with_pdl = session.generator(pdl).generate(prompts, 10)
    assert seen and set(seen) == {True}  # prefill, draft and verify forwards alike
    assert (with_pdl.outputs, with_pdl.accept_lengths) == (plain.outputs, plain.accept_lengths)
    assert launch._scope.get() is None  # nothing leaks out of the run


def test_a_served_run_and_the_profile_run_in_the_scope(target_dir, drafter_dir, make_prompts, seen):
    from specpilot.engine import profile
    from specpilot.engine.serving import Request, ServingEngine

    session, stock = _session(target_dir, drafter_dir)
    gen = session.generator(dataclasses.replace(stock, name="pdl", pdl=True))
    requests = [Request(tuple(p), max_new=6) for p in make_prompts(3, seed=4)]
    ServingEngine(gen, 2, prefill_chunk=16).run(requests)
    assert seen and set(seen) == {True}
    seen.clear()
    profile.profile(gen, make_prompts(1, seed=5), 6, curve_nodes=(2,))
    assert seen and set(seen) == {True}


def test_the_knob_reads_from_toml_and_leaves_default_fingerprints_alone():
    pdl = System.from_dict({"pdl": True}, name="p")
    assert pdl.pdl and "pdl = true" in pdl.to_toml()
    assert pdl.fingerprint() != System().fingerprint()
    assert dataclasses.replace(System(), pdl=False).fingerprint() == System().fingerprint()
