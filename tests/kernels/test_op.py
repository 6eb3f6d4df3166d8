"""`specpilot::linear`: under torch.compile each TritonLinear / W12Linear projection is one opaque
op that runs the kernels as eager code does; handles name each module's own, current weight."""

import copy
import gc
import math

import pytest
import torch
import torch.nn as nn

from specpilot.kernels import op
from specpilot.models.linear import TritonLinear
from specpilot.models.w12_linear import W12Linear

OPS = (torch.ops.specpilot.linear, torch.ops.specpilot.linear.default)


def bf16_linear(weight: torch.Tensor) -> nn.Linear:
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    with torch.no_grad():
        lin.weight.copy_(weight.float())
    return lin


@pytest.fixture
def modules(block_weight, device):
    """A TritonLinear [48, 64] and a W12Linear [40, 48] with escapes (finite weights: a NaN would
    hide a wrong weight behind the next projection)."""
    return (TritonLinear.from_linear(bf16_linear(block_weight(48, 64, seed=2))).to(device),
            W12Linear.from_linear(bf16_linear(block_weight(40, 48, seed=3))).to(device))


def two_projections(a: nn.Module, b: nn.Module, x: torch.Tensor) -> torch.Tensor:  # x [B, T, 64] -> [B, T, 40]
    return b(torch.relu(a(x))) * 2


def capture(graphs: list):
    """A torch.compile backend that keeps each captured graph and runs it as it is."""

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return backend


def op_nodes(gm) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in OPS]


@pytest.fixture
def dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("rows", [1, 5, 70])  # the GEMM (heuristic configs); past 64 rows, decode + cuBLAS
def test_compiled_projections_are_one_op_each_and_give_the_eager_outputs(modules, make_x, check, dynamo, rows):
    """fullgraph=True: no graph break anywhere; the captured graph calls the op once per module and
    holds nothing of the kernels; its outputs are the eager ones bit for bit (the eager call runs
    `dispatch.linear` directly, not through the op, so a wrong op body shows)."""
    a, b = modules
    x = make_x(rows, 64).reshape(1, rows, 64)
    eager = two_projections(a, b, x)
    check(a(x).reshape(rows, 48), x.reshape(rows, 64), a.weight)
    graphs = []
    compiled = torch.compile(two_projections, backend=capture(graphs), fullgraph=True, dynamic=False)
    got = compiled(a, b, x)
    assert torch.equal(got.view(torch.int32), eager.view(torch.int32))
    (gm,) = graphs
    assert [n.args[1:] for n in op_nodes(gm)] == [(a.handle, ""), (b.handle, "")]
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert not any("triton" in t for t in targets), targets


def test_a_graph_traced_for_one_module_is_not_run_with_its_weight_for_another(modules, block_weight, make_x,
                                                                             device, dynamo):
    """Each module's handle is a constant of the graph, guarded: other modules of the same shapes
    get a graph of their own, with their own weights."""
    a, b = modules
    a2 = TritonLinear.from_linear(bf16_linear(block_weight(48, 64, seed=4))).to(device)
    b2 = W12Linear.from_linear(bf16_linear(block_weight(40, 48, seed=5))).to(device)
    x = make_x(2, 64).reshape(1, 2, 64)
    graphs = []
    compiled = torch.compile(two_projections, backend=capture(graphs), fullgraph=True, dynamic=False)
    outputs = []
    for pair in ((a, b), (a2, b2), (a, b2)):
        outputs.append(compiled(*pair, x))
        assert torch.equal(outputs[-1], two_projections(*pair, x))
    assert len(graphs) == 3 and not torch.equal(outputs[0], outputs[1])


def test_a_handle_names_its_owners_current_weight_and_dies_with_it(block_weight):
    lin = bf16_linear(block_weight(40, 48))
    a, b = TritonLinear.from_linear(lin), W12Linear.from_linear(lin)
    assert op.weight_of(a.handle) is a.weight and op.weight_of(b.handle) is b.weight_w12
    before = b.weight_w12
    b._apply(torch.clone)  # new buffers, as a move to another device makes
    assert op.weight_of(b.handle) is b.weight_w12 is not before and b.weight_w12.lo is b.lo
    a2, b2 = copy.deepcopy(a), copy.deepcopy(b)  # as `engine.session.with_kernels` copies a W12 model
    assert a2.handle != a.handle and b2.handle != b.handle
    assert op.weight_of(a2.handle) is a2.weight and op.weight_of(b2.handle).lo is b2.lo is not b.lo
    handles = [m.handle for m in (a, b, a2, b2)]
    del a, b, a2, b2
    gc.collect()
    for handle in handles:
        with pytest.raises(RuntimeError, match=f"handle {handle} names no live weight"):
            op.weight_of(handle)
    assert not set(handles) & set(op._owners)


@pytest.mark.parametrize("rows", [(3,), (2, 5), (0,)])
def test_the_op_passes_opcheck(modules, make_x, rows):
    """Schema, the fake (meta) implementation against the real one, tracing with dynamic shapes."""
    M = math.prod(rows)
    for module in modules:
        x = make_x(max(M, 1), module.in_features)[:M].reshape(*rows, module.in_features)
        torch.library.opcheck(torch.ops.specpilot.linear.default, (x, module.handle, ""))


@pytest.mark.slow
def test_under_inductor_the_op_is_called_as_it_is(modules, make_x, dynamo):
    """Inductor lowers the graph around the op (to C++ on CPU, to Triton on a GPU, where these
    tests run the compiled kernels) and calls the op as an external kernel: the compiled outputs
    are the eager ones bit for bit."""
    a, b = modules
    x = make_x(3, 64).reshape(1, 3, 64)
    compiled = torch.compile(two_projections, backend="inductor", fullgraph=True, dynamic=False)
    assert torch.equal(compiled(a, b, x).view(torch.int32), two_projections(a, b, x).view(torch.int32))
