"""`draft_kernel`: the drafter's own projections, lm_head and feature fusion (a draft model, an
EAGLE-3 head, a DFlash drafter) on our Triton kernels (the system's `kernel_table`), the target's as
`kernel` says. The kernels run under Triton's interpreter on CPU."""

import dataclasses

import pytest
import torch

from specpilot.config import Deployment, DrafterKind, Kernel, System
from specpilot.engine.session import Session
from specpilot.errors import ConfigError
from specpilot.kernels import op
from specpilot.models.linear import TritonLinear

STOCK = System(drafter=DrafterKind.MODEL, depth=2, topk=2, tree_budget=4)


def session(bf16_dirs) -> Session:
    target, drafter = bf16_dirs
    return Session.load(Deployment(name="k", target=str(target), drafter=str(drafter), stock=STOCK),
                        device="cpu", dtype=torch.float32)


def test_the_draft_model_runs_the_kernels_with_the_table_and_the_rounds_keep_the_ar_tokens(
        interpreted_kernels, bf16_dirs, make_prompts, monkeypatch):
    s = session(bf16_dirs)
    prompts = make_prompts(1, seed=3, lo=4, hi=8)
    want = s.generator(STOCK.plain_ar()).generate(prompts, 5).outputs
    calls = []
    linear = op.linear
    monkeypatch.setattr(op, "linear", lambda x, handle, table: calls.append(table) or linear(x, handle, table))
    system = dataclasses.replace(STOCK, name="drafted", draft_kernel=Kernel.TRITON, kernel_table="/tmp/t.json")
    gen = s.generator(system)
    assert gen.generate(prompts, 5).outputs == want
    draft = next(iter(gen.drafters.values())).model
    swapped = [m for m in draft.modules() if isinstance(m, TritonLinear)]
    assert len(swapped) == 4 + 1 and {m.table for m in swapped} == {"/tmp/t.json"}  # one layer and the lm_head
    assert draft.lm_head.weight is s.drafter_model.lm_head.weight  # shared, not copied
    assert not any(isinstance(m, TritonLinear) for m in gen.target.modules())  # the target stays on cuBLAS
    assert not any(isinstance(m, TritonLinear) for m in s.drafter_model.modules())  # the session's model too
    assert calls and set(calls) == {"/tmp/t.json"}  # the kernels ran, with the table


def test_without_a_gpu_or_the_interpreter_it_is_one_config_error(bf16_dirs, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match="draft_kernel = 'triton' needs a CUDA device"):
        session(bf16_dirs).generator(dataclasses.replace(STOCK, name="d", draft_kernel=Kernel.TRITON))


def test_the_knob_reads_from_toml_carries_a_table_alone_and_leaves_default_fingerprints_alone():
    on = System.from_dict({"draft_kernel": "triton", "kernel_table": "/tmp/t.json"}, name="d")
    assert on.draft_kernel is Kernel.TRITON and on.kernel is Kernel.CUBLAS and 'draft_kernel = "triton"' in on.to_toml()
    assert dataclasses.replace(STOCK, draft_kernel=Kernel.CUBLAS).fingerprint() == STOCK.fingerprint()
    assert on.fingerprint() != on.with_changes(draft_kernel=Kernel.CUBLAS, kernel=Kernel.TRITON).fingerprint()
    with pytest.raises(ConfigError, match="draft_kernel"):
        System.from_dict({"draft_kernel": "cutlass"}, name="x")
    with pytest.raises(ConfigError, match="kernel_table needs kernel"):
        System(kernel_table="/tmp/t.json")


@pytest.fixture(scope="module")
def feature_drafter_dirs(bf16_dirs, tmp_path_factory):
    """An EAGLE-3 head and a DFlash drafter for the two-layer target."""
    from specpilot.models.dflash import random_dflash
    from specpilot.models.dflash_checkpoint import write_dflash
    from specpilot.models.eagle3 import random_eagle3
    from specpilot.models.eagle3_checkpoint import write_eagle3
    from specpilot.models.loading import load_model

    config = load_model(bf16_dirs[0]).config
    root = tmp_path_factory.mktemp("feature")
    eagle3 = random_eagle3(config, layer_ids=(0, 1, 1), seed=5)
    return {DrafterKind.EAGLE3: write_eagle3(eagle3, root / "e", dtype=torch.float32),
            DrafterKind.DFLASH: write_dflash(random_dflash(config, num_layers=1, block_size=4, mask_token_id=3),
                                             root / "d", dtype=torch.float32)}


@pytest.mark.parametrize("kind, swapped", [(DrafterKind.EAGLE3, 4 + 2), (DrafterKind.DFLASH, 4 + 1)])
def test_a_feature_drafters_own_weights_run_the_kernels_and_the_rounds_keep_the_ar_tokens(
        interpreted_kernels, bf16_dirs, feature_drafter_dirs, make_prompts, kind, swapped):
    """EAGLE-3: its layer's projections, `fc` and its lm_head; DFlash: its layer's and `fc` (it
    drafts through the target's lm_head, which stays `kernel`'s)."""
    stock = System(drafter=kind, depth=2, topk=2, tree_budget=4, block_size=4)
    s = Session.load(Deployment(name="f", target=str(bf16_dirs[0]), drafter=str(feature_drafter_dirs[kind]),
                                stock=stock), device="cpu", dtype=torch.float32)
    prompts = make_prompts(1, seed=4, lo=4, hi=8)
    want = s.generator(stock.plain_ar()).generate(prompts, 5).outputs
    gen = s.generator(dataclasses.replace(stock, name="k", draft_kernel=Kernel.TRITON, kernel_table="/tmp/t.json"))
    assert gen.generate(prompts, 5).outputs == want
    own = s.eagle3_model if kind is DrafterKind.EAGLE3 else s.dflash_model
    draft = next(iter(gen.drafters.values())).model
    assert draft is not own and isinstance(draft.fc, TritonLinear) and draft.fc.weight is own.fc.weight
    assert sum(isinstance(m, TritonLinear) for m in draft.modules()) == swapped
    assert {m.table for m in draft.modules() if isinstance(m, TritonLinear)} == {"/tmp/t.json"}
    assert not any(isinstance(m, TritonLinear) for m in [*own.modules(), *gen.target.modules()])


# ---- draft_kernel = "fused": the draft model's decoder layers in four fused kernels each ---------

@pytest.fixture(scope="module")
def d32_dirs(tmp_path_factory):
    """A two-layer target and a one-layer drafter with heads of 32 (the fused kernels' smallest)."""
    from specpilot.models import random_checkpoint as rc

    root = tmp_path_factory.mktemp("d32")
    target = rc.write_random_checkpoint(root / "target", rc.tiny_config(num_layers=2, head_dim=32), seed=0,
                                        dtype=torch.bfloat16)
    return target, rc.write_truncated_drafter(target, root / "drafter", num_layers=1)


def test_the_fused_draft_layers_run_and_the_rounds_keep_the_ar_tokens(interpreted_kernels, d32_dirs, make_prompts,
                                                                      monkeypatch):
    """Lossless: two prompts, greedy, the tokens of plain AR; the kernels ran (the proposal's few
    rows), the prefill took the plain forward, and the clone shares the session's tensors."""
    from specpilot.kernels import draft_layer
    from specpilot.models.fused_decoder import FusedDecoder

    s = session(d32_dirs)
    prompts = make_prompts(2, seed=5, lo=4, hi=8)
    want = s.generator(STOCK.plain_ar()).generate(prompts, 5).outputs
    calls = []
    for name in ("norm_qkv_rope_eager", "rows_linear_eager"):
        fn = getattr(draft_layer, name)
        monkeypatch.setattr(draft_layer, name, lambda *a, fn=fn, name=name: calls.append(name) or fn(*a))
    gen = s.generator(dataclasses.replace(STOCK, name="fused", draft_kernel=Kernel.FUSED))
    assert gen.generate(prompts, 5).outputs == want
    draft = next(iter(gen.drafters.values())).model
    assert isinstance(draft, FusedDecoder) and not isinstance(s.drafter_model, FusedDecoder)
    assert draft.lm_head.weight is s.drafter_model.lm_head.weight  # shared, not copied
    layers = calls.count("norm_qkv_rope_eager")  # one layer: o, gate|up, down, and the lm_head where logits are asked
    assert layers and 3 * layers < calls.count("rows_linear_eager") <= 4 * layers


def test_the_fused_layers_off_a_gpu_and_the_interpreter_fall_back_to_the_plain_forward(d32_dirs, make_prompts,
                                                                                     monkeypatch):
    from specpilot.engine.session import ran_on_device

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    s = session(d32_dirs)
    prompts = make_prompts(1, seed=6, lo=4, hi=8)
    system = dataclasses.replace(STOCK, name="fused", draft_kernel=Kernel.FUSED)
    assert s.generator(system).generate(prompts, 4).outputs == s.generator(STOCK.plain_ar()).generate(prompts, 4).outputs
    assert ran_on_device(system, "cpu")["draft_kernel"][0] == "torch"
    eagle = dataclasses.replace(system, drafter=DrafterKind.EAGLE3)
    assert ran_on_device(eagle, "cuda")["draft_kernel"][0] == "cublas"  # EAGLE-3 / DFlash keep their path


def test_fused_is_a_draft_kernel_only_and_reads_from_toml():
    on = System.from_dict({"draft_kernel": "fused"}, name="f")
    assert on.draft_kernel is Kernel.FUSED and 'draft_kernel = "fused"' in on.to_toml()
    assert on.fingerprint() != STOCK.fingerprint()
    with pytest.raises(ConfigError, match="kernel = 'fused' is not a projection kernel of the target"):
        System.from_dict({"kernel": "fused"}, name="t")
    with pytest.raises(ConfigError, match="kernel_table needs kernel"):
        System(draft_kernel=Kernel.FUSED, kernel_table="/tmp/t.json")


def test_a_compiled_proposal_calls_the_fused_layers_as_ops_in_one_graph(interpreted_kernels, d32_dirs, make_prompts,
                                                                        monkeypatch):
    """draft_compile with the fused layers: Dynamo captures the proposal whole (no graph break at the
    kernels), each layer's four kernels and the lm_head one custom op each (the qkv op mutating the
    cache), and the rounds keep the eager tokens."""
    from specpilot.models import ops

    graphs: list = []
    monkeypatch.setattr(ops, "STATIC_BACKEND", lambda gm, example_inputs: graphs.append(gm) or gm.forward)
    torch._dynamo.reset()
    s = session(d32_dirs)
    prompts = make_prompts(1, seed=7, lo=4, hi=8)
    fused = dataclasses.replace(STOCK, name="fused", draft_kernel=Kernel.FUSED)
    eager = s.generator(fused).generate(prompts, 4)
    compiled = s.generator(dataclasses.replace(fused, name="c", draft_compile=True)).generate(prompts, 4)
    torch._dynamo.reset()
    targets = [n.target for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    qkv_op, rows_op = torch.ops.specpilot.draft_norm_qkv_rope, torch.ops.specpilot.draft_rows_linear
    qkv = [t for t in targets if t in (qkv_op, qkv_op.default)]
    rows = [t for t in targets if t in (rows_op, rows_op.default)]
    assert len(graphs) == 1 and qkv and len(rows) >= 3 * len(qkv)  # one layer: catch-up and each level
    assert (compiled.outputs, compiled.accept_lengths) == (eager.outputs, eager.accept_lengths)
