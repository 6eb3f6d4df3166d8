"""The Gated DeltaNet decode / verify step on the GPU: the causal conv and the fused recurrence.

Owns: `gdn_conv` (one kernel: each token's conv inputs gathered along its history, the depthwise
conv, SiLU) and `gdn_recurrence` (one kernel: q/k L2 norm and scale, the GQA mapping, the gates and
the gated delta rule, token after token from the committed state), their launchers, the custom ops
torch.compile sees (`specpilot::gdn_conv`, `specpilot::gdn_recurrence`), and pure-torch versions of
the same math used where the kernels cannot run (CPU without the interpreter, no Triton).

Semantics are those of `specpilot.models.gdn` (`conv_windows` + `causal_conv`; `heads`, `gates`,
`chunk_scan` / `tree_scan`), ported here because kernels sit below models and take plain tensors
and dims (`models.gdn` owns the layer and calls these). The shape of a forward is the one of
`models.recurrence.Recurrence`:

- a causal chunk (`parents` None): token t continues token t - 1, token 0 the committed state;
  the state after token commit[b] is written over row b's committed state (commit -1: untouched);
- a tree (`parents` [B,T], parents[b,t] < t, -1 the committed state): every node's state is
  written into `node_state[:, t]`, the committed state is only read.

A row with `fresh[b]` (its first token at position 0) starts from the zero state, and conv inputs
before position 0 are zeros. States are float32 throughout.

The rules:
- One program of the recurrence owns a [Dk, BLOCK_V] block of one (row, value head) state for all
  T tokens, in registers; a tree node whose parent is the previous node continues in registers,
  any other reloads the committed state or its parent's stored state. The instructions per token
  are the same in both shapes, and the blocking depends only on (Dk, Dv), not on the batch: a
  node's state and output are bit for bit those of the chunk of its root path, at any batch size.
- Exact in the math, not the rounding: float32 sums in another order than torch's; the conv is
  rounded to the model dtype before its SiLU, beta to b's dtype, as the reference does.
- Any Dk <= 256 and any Dv (the state block is padded to powers of two and masked); float32,
  BF16 or float16 activations; any conv width K. Inputs are read through their strides (the
  projection's slices need no copy); only the innermost dimension must be contiguous, and the
  states' inner [Dk, Dv] (the cache's buffers are written in place, never copied).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specpilot import env
from specpilot.kernels.configs import next_pow2
from specpilot.kernels.dispatch import kernels_available

BLOCK_V = 16  # value columns per recurrence program (fixed: the blocking is batch-invariant)
MAX_DK = 256  # the state block [next_pow2(Dk), BLOCK_V] must fit registers
CONV_BLOCK_C = 256  # channels per conv program (the interpreter takes up to 1024: fewer programs)
EPS = 1e-6  # inside the L2 norm's rsqrt



def _cdiv(a: int, b: int) -> int:
    return -(-a // b)



def _round_code(dtype: torch.dtype) -> int:
    """The grid of `gdn_kernel._round` for a dtype (0: float32 as is, 1: BF16, 2: float16)."""
    codes = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
    if dtype not in codes:
        raise ValueError(f"gdn kernels: unsupported dtype {dtype}")
    return codes[dtype]


def _last_dim_unit(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


# ---- the causal conv -------------------------------------------------------------------------

def _check_conv(x, window, positions, weight, parents, depths, commit=None) -> int:
    B, T, Cc = x.shape
    K = weight.shape[-1]
    if (window.shape != (B, K - 1, Cc) or weight.shape != (Cc, K) or positions.shape != (B, T)
            or (parents is None) != (depths is None)
            or (parents is not None and (parents.shape != (B, T) or depths.shape != (B, T)))
            or (commit is not None and (T != 1 or parents is not None or commit.shape != (B,)))):
        raise ValueError(f"gdn_conv: x {tuple(x.shape)}, window {tuple(window.shape)}, weight {tuple(weight.shape)}, "
                         f"positions {tuple(positions.shape)}, parents/depths "
                         f"{None if parents is None else (tuple(parents.shape), tuple(depths.shape))}, commit "
                         f"{None if commit is None else tuple(commit.shape)} (a one-token chunk only)")
    return K


def gdn_conv_eager(x: torch.Tensor, window: torch.Tensor, positions: torch.Tensor, weight: torch.Tensor,
                   parents: torch.Tensor | None = None, depths: torch.Tensor | None = None,
                   commit: torch.Tensor | None = None) -> torch.Tensor:
    """`gdn_conv` by the kernel, called directly."""
    from specpilot.kernels.gdn_kernel import gdn_conv_kernel

    K = _check_conv(x, window, positions, weight, parents, depths, commit)
    B, T, Cc = x.shape
    x = _last_dim_unit(x)
    if window.stride(-1) != 1:
        if commit is not None:
            raise ValueError("gdn_conv: a window committed in place needs a unit last stride")
        window = window.contiguous()
    y = torch.empty(B, T, Cc, dtype=x.dtype, device=x.device)
    tree = parents is not None
    par, dep = (_last_dim_unit(parents), _last_dim_unit(depths)) if tree else (positions, positions)  # unread: chunk
    block = min(1024, max(CONV_BLOCK_C, next_pow2(Cc))) if env.triton_interpret() else CONV_BLOCK_C
    cm = commit.contiguous() if commit is not None else positions  # unread without a commit
    gdn_conv_kernel[(B * T, _cdiv(Cc, block))](  # tokens on the grid's first axis: up to 2^31 - 1
        x, window, positions, weight, par, dep, cm, y,
        x.stride(0), x.stride(1), window.stride(0), window.stride(1), positions.stride(0), positions.stride(1),
        weight.stride(0), weight.stride(1), par.stride(0), dep.stride(0), y.stride(0), y.stride(1),
        T, Cc, K=K, BLOCK_C=block, TREE=tree, ROUND=_round_code(x.dtype), COMMIT=commit is not None,
        KP2=next_pow2(max(1, K - 1)), num_warps=4,
    )
    return y


def commit_window(window: torch.Tensor, x: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """The conv inputs of the K-1 tokens ending at chunk token last[b] (window [B,K-1,Cc], x [B,T,Cc]);
    the old window where last[b] < 0."""
    B, Km1, Cc = window.shape
    full = torch.cat([window, x], dim=1)
    idx = last.clamp(min=-1)[:, None] + 1 + torch.arange(Km1, device=x.device)  # [B,K-1]
    new = full.gather(1, idx[..., None].expand(B, Km1, Cc))
    return torch.where((last >= 0)[:, None, None], new, window)


def conv_reference(x: torch.Tensor, window: torch.Tensor, positions: torch.Tensor, weight: torch.Tensor,
                   parents: torch.Tensor | None = None, depths: torch.Tensor | None = None) -> torch.Tensor:
    """`gdn_conv` in plain torch (the math of `models.gdn.conv_windows` + `causal_conv`)."""
    K = _check_conv(x, window, positions, weight, parents, depths)
    B, T, Cc = x.shape
    t = torch.arange(T, device=x.device).expand(B, T)
    depth = t if parents is None else depths
    anc, cols = t, []
    for j in range(K):  # j steps back
        if j:
            anc = t - j if parents is None else torch.where(anc >= 0, parents.gather(1, anc.clamp(min=0)), anc)
        cols.append(torch.where(j <= depth, K - 1 + anc, K - 1 - (j - depth)))
    idx = torch.stack(cols[::-1], dim=-1).reshape(B, T * K, 1).expand(B, T * K, Cc)  # oldest first
    win = torch.cat([window, x], dim=1).gather(1, idx).view(B, T, K, Cc)
    live = positions[:, :, None] - torch.arange(K - 1, -1, -1, device=x.device) >= 0
    win = win * live[..., None].to(win.dtype)
    return F.silu((win.float() * weight.float().t()).sum(2).to(x.dtype))


@torch.library.custom_op("specpilot::gdn_conv", mutates_args=())
def _gdn_conv_op(x: torch.Tensor, window: torch.Tensor, positions: torch.Tensor, weight: torch.Tensor,
                 parents: torch.Tensor | None, depths: torch.Tensor | None) -> torch.Tensor:
    return gdn_conv_eager(x, window, positions, weight, parents, depths)


@_gdn_conv_op.register_fake
def _(x, window, positions, weight, parents, depths):
    return x.new_empty(x.shape)


@torch.library.custom_op("specpilot::gdn_conv_commit", mutates_args=("window",))
def _gdn_conv_commit_op(x: torch.Tensor, window: torch.Tensor, positions: torch.Tensor, weight: torch.Tensor,
                        commit: torch.Tensor) -> torch.Tensor:
    return gdn_conv_eager(x, window, positions, weight, commit=commit)


@_gdn_conv_commit_op.register_fake
def _(x, window, positions, weight, commit):
    return x.new_empty(x.shape)


def gdn_conv(x: torch.Tensor, window: torch.Tensor, positions: torch.Tensor, weight: torch.Tensor,
             parents: torch.Tensor | None = None, depths: torch.Tensor | None = None,
             commit: torch.Tensor | None = None) -> torch.Tensor:
    """silu(causal depthwise conv) [B,T,Cc] in x's dtype of conv inputs x [B,T,Cc] (any strides, last 1)
    along each token's history: committed window [B,K-1,Cc], positions [B,T], weight [Cc,K]; a tree
    with parents, depths [B,T]. With `commit` [B] (a one-token chunk, T == 1: a decode step), the
    window then moves on by the token's input in place where commit[b] >= 0 (`commit_window`), in
    the same kernel. The kernel on CUDA / the interpreter (one custom op under torch.compile), else
    `conv_reference`."""
    if not kernels_available(x):
        y = conv_reference(x, window, positions, weight, parents, depths)
        if commit is not None:
            _check_conv(x, window, positions, weight, parents, depths, commit)
            window.copy_(commit_window(window, x, commit))
        return y
    if torch.compiler.is_compiling():
        if commit is not None:
            return torch.ops.specpilot.gdn_conv_commit(x, window, positions, weight, commit)
        return torch.ops.specpilot.gdn_conv(x, window, positions, weight, parents, depths)
    return gdn_conv_eager(x, window, positions, weight, parents, depths, commit)


# ---- the recurrence ----------------------------------------------------------------------------

def _check_recurrence(y, a, b, A_log, dt_bias, state, fresh, num_key_heads, parents, commit, node_state):
    B, T, Cc = y.shape
    _, Hv, Dk, Dv = state.shape
    Hk = num_key_heads
    bad = (state.shape[0] != B or a.shape != (B, T, Hv) or b.shape != (B, T, Hv) or A_log.shape != (Hv,)
           or dt_bias.shape != (Hv,) or fresh.shape != (B,) or Hk < 1 or Hv % Hk or Cc != 2 * Hk * Dk + Hv * Dv
           or Dk > MAX_DK or state.dtype != torch.float32 or state.stride(-1) != 1 or state.stride(-2) != Dv)
    if parents is None:
        bad = bad or (commit is not None and commit.shape != (B,))
    else:
        bad = (bad or parents.shape != (B, T) or node_state is None or node_state.dtype != torch.float32
               or node_state.shape[0] != B or node_state.shape[1] < T or node_state.shape[2:] != state.shape[1:]
               or node_state.stride(-1) != 1 or node_state.stride(-2) != Dv)
    if bad:
        shapes = {n: None if t is None else (tuple(t.shape), str(t.dtype).removeprefix("torch."))
                  for n, t in dict(y=y, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state, fresh=fresh,
                                   parents=parents, commit=commit, node_state=node_state).items()}
        raise ValueError(f"gdn_recurrence: num_key_heads {Hk} (Dk <= {MAX_DK}, state's inner [Dk,Dv] "
                         f"contiguous), {shapes}")
    return B, T, Hv, Dk, Dv


def recurrence_warps(Dk: int, block_v: int = BLOCK_V) -> int:
    """Warps of a recurrence program: 16 state entries per thread, 1 to 4 warps."""
    return max(1, min(4, max(16, next_pow2(Dk)) * block_v // 512))


def gdn_recurrence_eager(y, a, b, A_log, dt_bias, state, fresh, num_key_heads: int, parents=None, commit=None,
                         node_state=None, *, block_v: int = BLOCK_V, num_warps: int | None = None) -> torch.Tensor:
    """`gdn_recurrence` by the kernel, called directly; `block_v`, `num_warps` override the blocking
    (timing sweeps: another blocking sums in another order, so keep one per (Dk, Dv))."""
    from specpilot.kernels.gdn_kernel import gdn_recurrence_kernel

    B, T, Hv, Dk, Dv = _check_recurrence(y, a, b, A_log, dt_bias, state, fresh, num_key_heads, parents, commit,
                                         node_state)
    y = _last_dim_unit(y)
    # vectors read at [b] or [h], and the parents at [b, t]: unit strides (copies only where not)
    fresh, A_log, dt_bias = fresh.contiguous(), A_log.contiguous(), dt_bias.contiguous()
    commit = commit.contiguous() if commit is not None else None
    parents = _last_dim_unit(parents) if parents is not None else None
    o = torch.empty(B, T, Hv, Dv, dtype=y.dtype, device=y.device)
    tree = parents is not None
    if not tree and commit is None:
        commit = torch.full((B,), -1, dtype=torch.int64, device=y.device)
    par = parents if tree else commit  # unread in a chunk
    nodes = node_state if tree else state  # unread in a chunk
    com = commit if not tree else parents  # unread in a tree (int64 either way: one compiled kernel)
    BK = max(16, next_pow2(Dk))
    if T > 0:
        gdn_recurrence_kernel[(_cdiv(Dv, block_v), B * Hv)](
            y, a, b, A_log, dt_bias, state, fresh, com, par, nodes, o,
            y.stride(0), y.stride(1), a.stride(0), a.stride(1), a.stride(2), b.stride(0), b.stride(1), b.stride(2),
            state.stride(0), state.stride(1), state.stride(2), par.stride(0),
            nodes.stride(0), nodes.stride(1) if tree else 0, nodes.stride(2) if tree else state.stride(1),
            o.stride(0), o.stride(1), o.stride(2),
            T, int(tree), Hv, Hv // num_key_heads, num_key_heads, Dk, Dv, Dk**-0.5,
            BK=BK, BV=block_v, ROUND=_round_code(y.dtype), BETA_ROUND=_round_code(b.dtype),
            num_warps=num_warps or recurrence_warps(Dk, block_v),
        )
    return o


def gates(a, b, A_log, dt_bias):
    """log-decay g and write strength beta [B,T,Hv] in float32, as transformers computes them."""
    beta = b.sigmoid().float()
    return -A_log.float().exp() * F.softplus(a.float() + dt_bias), beta


def heads(y, Hk: int, Hv: int, Dk: int, Dv: int):
    """Conv output y [B,T,Cc] -> q, k [B,T,Hv,Dk] (L2-normalised, q scaled by Dk^-0.5, each key head
    repeated for its value heads) and v [B,T,Hv,Dv], all float32."""
    B, T, _ = y.shape
    q, k, v = y.split([Hk * Dk, Hk * Dk, Hv * Dv], dim=-1)
    q, k = (t.reshape(B, T, Hk, Dk).float().repeat_interleave(Hv // Hk, dim=2) for t in (q, k))
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + EPS) * Dk**-0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + EPS)
    return q, k, v.reshape(B, T, Hv, Dv).float()


def recurrence_reference(y, a, b, A_log, dt_bias, state, fresh, num_key_heads: int, parents=None, commit=None,
                         node_state=None) -> torch.Tensor:
    """`gdn_recurrence` in plain torch, token after token (the math of `models.gdn.heads`, `gates`, `step`)."""
    B, T, Hv, Dk, Dv = _check_recurrence(y, a, b, A_log, dt_bias, state, fresh, num_key_heads, parents, commit,
                                         node_state)
    q, k, v = heads(y, num_key_heads, Hv, Dk, Dv)
    g, beta = gates(a, b, A_log, dt_bias)
    S0 = torch.where(fresh[:, None, None, None], torch.zeros_like(state), state)
    rows = torch.arange(B, device=y.device)
    S, out = S0, []
    for t in range(T):
        if parents is not None:
            p = parents[:, t]
            S = torch.where((p < 0)[:, None, None, None], S0, node_state[rows, p.clamp(min=0)])
        S = S * g[:, t].exp()[..., None, None]
        kv = (S * k[:, t, :, :, None]).sum(-2)
        S = S + k[:, t, :, :, None] * ((v[:, t] - kv) * beta[:, t, :, None])[..., None, :]
        out.append((S * q[:, t, :, :, None]).sum(-2))
        if parents is not None:
            node_state[:, t] = S
        elif commit is not None:
            state.copy_(torch.where((commit == t)[:, None, None, None], S, state))
    return torch.stack(out, 1).to(y.dtype) if out else y.new_empty(B, 0, Hv, Dv)


@torch.library.custom_op("specpilot::gdn_recurrence", mutates_args=("state", "node_state"))
def _gdn_recurrence_op(y: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                       dt_bias: torch.Tensor, state: torch.Tensor, fresh: torch.Tensor, num_key_heads: int,
                       parents: torch.Tensor | None, commit: torch.Tensor | None,
                       node_state: torch.Tensor | None) -> torch.Tensor:
    return gdn_recurrence_eager(y, a, b, A_log, dt_bias, state, fresh, num_key_heads, parents, commit, node_state)


@_gdn_recurrence_op.register_fake
def _(y, a, b, A_log, dt_bias, state, fresh, num_key_heads, parents, commit, node_state):
    B, T = y.shape[:2]
    return y.new_empty(B, T, state.shape[1], state.shape[3])


def gdn_recurrence(y: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                   state: torch.Tensor, fresh: torch.Tensor, num_key_heads: int,
                   parents: torch.Tensor | None = None, commit: torch.Tensor | None = None,
                   node_state: torch.Tensor | None = None) -> torch.Tensor:
    """o [B,T,Hv,Dv] in y's dtype of conv outputs y [B,T,Cc] (Cc = 2 Hk Dk + Hv Dv, any strides, last 1),
    gate inputs a, b [B,T,Hv] (read through their strides: slices of the projection are fine), from
    the float32 committed state [B,Hv,Dk,Dv] (zero where fresh [B] bool). A chunk commits the state
    after token commit[b] into `state`; a tree (parents [B,T]) writes node states into node_state
    [B,>=T,Hv,Dk,Dv]. The kernel on CUDA / the interpreter (one custom op under torch.compile), else
    `recurrence_reference`."""
    args = (y, a, b, A_log, dt_bias, state, fresh, num_key_heads, parents, commit, node_state)
    if not kernels_available(y):
        return recurrence_reference(*args)
    if torch.compiler.is_compiling():
        return torch.ops.specpilot.gdn_recurrence(*args)
    return gdn_recurrence_eager(*args)
