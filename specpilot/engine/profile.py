"""Measure where a system's decoding time goes: the numbers the loop's cost model consumes.

Owns: one profiling pass of a `Generator` on given prompts — a real generation (round time,
tokens per round, per-depth acceptance), then isolated timings of the pieces of a round replayed
on the final state (draft proposal, target forward over N tree nodes for a range of N, the plain AR
step), plus memory-bandwidth and byte-size facts for the byte floors. Replays of the draft and
verify forwards write only scratch cache slots past each row's length, so they are idempotent.

Does not own what to do with the numbers (`specpilot.loop.cost_model`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from specpilot.engine.generator import Generator
from specpilot.engine.steps import tree_forward
from specpilot.engine.tree import DraftTree
from specpilot.models import ops
from specpilot.models.transformer import Transformer


@dataclass(frozen=True)
class StepProfile:
    device: str
    batch: int
    tokens_per_round: float  # mean tokens committed per round (accepted + bonus), per row
    round_ms: float  # mean wall time of one decode round (whole batch)
    draft_ms: float  # one proposal (0 for AR)
    verify_ms: float  # one target forward over the system's tree (the AR step's forward for AR)
    verify_curve_ms: dict  # N nodes -> target forward ms
    accept_at_depth: tuple[float, ...]  # P(accepted drafts >= d), d = 1..max
    tree_nodes: int  # N of the system's tree (1 for AR)
    target_bytes: int  # weight bytes streamed per target forward
    drafter_bytes: int  # weight bytes streamed per draft forward
    kv_bytes_per_token: int  # target KV bytes per cached token (K and V, all layers)
    bandwidth_gbps: float  # measured device copy bandwidth (GB/s, read + write)
    matmul_tflops: float  # measured dense matmul rate in the model's dtype
    target_params: int  # parameters touched per token (FLOPs per token ~ 2 x this)
    drafter_params: int
    draft_forwards: int  # draft-model forwards per round (catch-up + expansions)
    context: float  # mean cached tokens per row during the profiled generation
    head_params: int = 0  # of target_params, the lm_head's (left in BF16 by W12; 0: stored before)
    # recurrent layers (hybrid targets; 0 for dense ones or stored before): bytes a target forward
    # moves per row whatever its node count (the committed states and conv windows read), and per
    # node (each node's state written for the commit, its conv input)
    state_bytes_per_row: int = 0
    state_bytes_per_node: int = 0

    @property
    def ms_per_token(self) -> float:
        return self.round_ms / self.tokens_per_round

    @property
    def overhead_ms(self) -> float:
        return max(self.round_ms - self.draft_ms - self.verify_ms, 0.0)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ms_per_token"], d["overhead_ms"] = self.ms_per_token, self.overhead_ms
        return d


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn, device: torch.device, reps: int = 10, warmup: int = 2) -> float:
    """Median ms of fn(); on CUDA the call is captured into a graph and replayed."""
    for _ in range(warmup):
        fn()
    _sync(device)
    if device.type == "cuda":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        fn = graph.replay
        fn()
    times = []
    for _ in range(reps):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    return times[len(times) // 2]


def bandwidth_gbps(device: torch.device, mib: int = 256) -> float:
    n = mib * (1 << 20) // 4
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device, reps=5, warmup=1)
    return 2 * n * 4 / (ms * 1e-3) / 1e9


def matmul_tflops(device: torch.device, dtype: torch.dtype, n: int = 2048) -> float:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    ms = time_ms(lambda: a @ b, device, reps=5, warmup=1)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def touched_params(model: Transformer) -> int:
    """Parameters a token multiplies (embedding lookups excluded), whatever their storage format."""
    c = model.config
    return c.num_params - (0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size)


def streamed_bytes(model: Transformer) -> int:
    """Weight bytes one forward must read: every parameter and buffer (packed W12 planes are buffers)
    but the RoPE tables and the embedding table, of which one row is read."""
    total = 0
    for name, t in list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers() if "rope" not in n]:
        total += t.numel() * t.element_size()
    table = getattr(model, "embed_tokens", None)  # feature-conditioned heads may share the target's
    e = table.weight if table is not None else None
    if e is not None and model.lm_head.weight is not e:
        total -= e.numel() * e.element_size() - e.shape[1] * e.element_size()
    return total


def kv_bytes_per_token(model: Transformer) -> int:
    """K and V bytes per cached token over the attention layers."""
    c = model.config
    return 2 * len(c.attention_layers) * c.num_kv_heads * c.head_dim * model.dtype.itemsize


def state_bytes(model: Transformer) -> tuple[int, int]:
    """(per row, per node) bytes the recurrent layers move in one forward (`StepProfile`): a float32
    state [Hv,Dk,Dv] and a conv window of K-1 inputs read per row; a state written and a conv input
    kept per node. (0, 0) for a dense decoder."""
    c = model.config
    L = len(c.linear_layers)
    state = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4
    conv = c.conv_dim * model.dtype.itemsize
    return L * (state + (c.linear_conv_kernel_dim - 1) * conv), L * (state + conv)


def acceptance_by_depth(accept_lengths: list[list[int]], max_depth: int) -> tuple[float, ...]:
    """P(accepted drafts >= d) over all rounds of all rows, d = 1..max_depth."""
    rounds = [a - 1 for row in accept_lengths for a in row]
    if not rounds or max_depth < 1:
        return ()
    return tuple(sum(r >= d for r in rounds) / len(rounds) for d in range(1, max_depth + 1))


WARMUP_TOKENS = 8
# verify forwards timed for the cost model's curve, up to the largest tree the loop's search reaches
# (`loop.cost_model.BUDGETS`), so a prediction for a big tree interpolates instead of extrapolating
CURVE_NODES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)


def warm_up(gen: Generator, prompts: list[list[int]], max_new_tokens: int) -> None:
    """Run a short generation of `prompts` before a timed one (compilation, graph capture). A short
    one suffices: on the H200, a full-length warm-up moved no entry of the loop's cost table by more
    than 0.2% (`scripts/switch_estimates.py`)."""
    gen.generate(prompts, min(max_new_tokens, WARMUP_TOKENS))


def profile(gen: Generator, prompts: list[list[int]], max_new_tokens: int,
            curve_nodes: tuple[int, ...] = CURVE_NODES) -> StepProfile:
    """Run one generation, then time its round's pieces in isolation."""
    device = gen.target.device
    warm_up(gen, prompts, max_new_tokens)
    result = gen.generate(prompts, max_new_tokens)
    rounds = max(max(result.rounds), 1)
    round_ms = (result.seconds - result.prefill_seconds) / rounds * 1e3
    ws = next(reversed(gen.workspaces.values()))  # the one the generation just used
    state, cache = ws.state, ws.cache
    prefix = state.cache_prefix()
    B = state.batch
    drafter = next(iter(gen.drafters.values()), None)
    with torch.inference_mode(), gen.launching():  # the pieces launch as the generator's rounds do
        if drafter is not None and not drafter.needs_host_tokens:
            draft_ms = time_ms(lambda: drafter.propose(state), device)
            tree = drafter.propose(state)
        else:
            draft_ms = 0.0
            N = drafter.num_nodes if drafter is not None else 1
            tree = DraftTree.chain(state.roots()[:, None].repeat(1, N))
        tree.ancestors()
        # the system's own verify forward as its rounds run it (compiled with `verify_compile`); the
        # curve below is eager, and the cost model uses only its ratios
        forward = ops.compiled_static(tree_forward, device) if gen.verify_compile else tree_forward
        verify_ms = time_ms(lambda: forward(gen.target, cache, tree, prefix), device)
        curve = {}
        largest = max(curve_nodes, default=0)
        if getattr(cache, "nodes", largest) < largest:
            # a recurrent target's node scratch is sized for the system's trees: the curve's larger
            # ones run on a cache of their own (same rows and slots; its contents do not change a
            # forward's time)
            cache = gen.target.new_cache(B, cache.capacity, nodes=largest)
        for n in curve_nodes:
            if int(prefix.max()) + n >= cache.capacity:
                continue
            t = DraftTree.chain(state.roots()[:, None].repeat(1, n))
            t.ancestors()
            curve[n] = time_ms(lambda: tree_forward(gen.target, cache, t, prefix), device)
    tokens_per_round = result.num_tokens / max(sum(result.rounds), 1)
    depth = getattr(drafter, "depth", 0)
    dmodel = getattr(drafter, "model", None)
    return StepProfile(
        device=str(device),
        batch=B,
        tokens_per_round=tokens_per_round,
        round_ms=round_ms,
        draft_ms=draft_ms,
        verify_ms=verify_ms,
        verify_curve_ms=curve,
        accept_at_depth=acceptance_by_depth(result.accept_lengths, depth),
        tree_nodes=tree.num_nodes,
        target_bytes=streamed_bytes(gen.target),
        drafter_bytes=streamed_bytes(dmodel) if dmodel is not None else 0,
        kv_bytes_per_token=kv_bytes_per_token(gen.target),
        bandwidth_gbps=bandwidth_gbps(device),
        matmul_tflops=matmul_tflops(device, gen.target.dtype),
        target_params=touched_params(gen.target),
        drafter_params=touched_params(dmodel) if dmodel is not None else 0,
        draft_forwards=depth if dmodel is not None else 0,
        context=sum(len(p) for p in prompts) / len(prompts) + result.num_tokens / len(prompts) / 2,
        head_params=gen.target.lm_head.weight.numel(),
        state_bytes_per_row=state_bytes(gen.target)[0],
        state_bytes_per_node=state_bytes(gen.target)[1],
    )
