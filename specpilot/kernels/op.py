"""`specpilot::linear`: a projection by our kernels as one custom op that torch.compile does not enter.

Owns: the op (`dispatch.linear` behind `torch.library.custom_op`, with the fake that gives its
output's shape while tracing) and the registry of the weights it reads. Under torch.compile the
op is one opaque node of the captured graph: neither Dynamo nor inductor sees the Triton kernels,
their launch code or the helper modules they call (inductor cannot recompile user kernels that call
`tiles.*`); the op runs them as eager code would.

An op takes tensors, ints and strs, not a weight object, so a weight is named by a handle:
`register(owner, attribute)` returns an int that resolves, at every call, to `getattr(owner,
attribute)` -- read through the owner, so it follows `.to()` and `load_state_dict`, and it is the
owner's own object (`dispatch` and the kernels cache per `W12Weight`). The registry holds owners
weakly: a handle dies with its owner and is never reused. A copy of an owner (deepcopy, pickle)
carries its original's handle, so owners register again when copied (`__setstate__`).

Eager calls (`linear` outside torch.compile) run `dispatch.linear` directly: the same code the op
runs, without the dispatcher's round trip per projection.

Does not own the kernels or the choice among them (`dispatch`), nor the modules that register
(`specpilot.models.linear`, `specpilot.models.w12_linear`).
"""

from __future__ import annotations

import itertools
import weakref

import torch

from specpilot.kernels import dispatch
from specpilot.w12.weight import W12Weight

_owners: dict[int, tuple[weakref.ref, str]] = {}  # handle -> (its owner, the attribute holding the weight)
_handles = itertools.count()


def register(owner: object, attribute: str) -> int:
    """A new handle naming `getattr(owner, attribute)` (a BF16 [N, K] tensor or a W12Weight) while
    `owner` lives."""
    handle = next(_handles)
    _owners[handle] = (weakref.ref(owner, lambda _, h=handle: _owners.pop(h, None)), attribute)
    return handle


def weight_of(handle: int) -> W12Weight | torch.Tensor:
    """The weight `handle` names now (its owner's attribute, read at this call)."""
    entry = _owners.get(handle)
    owner = entry[0]() if entry is not None else None
    if owner is None:
        raise RuntimeError(f"projection handle {handle} names no live weight")
    return getattr(owner, entry[1])


@torch.library.custom_op("specpilot::linear", mutates_args=())
def _linear_op(x: torch.Tensor, handle: int, table: str) -> torch.Tensor:
    return dispatch.linear(x, weight_of(handle), table=table)


@_linear_op.register_fake
def _(x: torch.Tensor, handle: int, table: str) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight_of(handle).shape[0])


def linear(x: torch.Tensor, handle: int, table: str = "") -> torch.Tensor:
    """x [..., K] @ W [N, K].T -> [..., N] by `dispatch.linear` for the weight `handle` names (`table`
    as there): under torch.compile the op `specpilot::linear`, else the same call directly."""
    if torch.compiler.is_compiling():
        return torch.ops.specpilot.linear(x, handle, table)
    return dispatch.linear(x, weight_of(handle), table=table)
