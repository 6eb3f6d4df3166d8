"""Measure where a system's decoding time goes: the numbers the loop's cost model consumes.

Owns: one profiling pass of a `Generator` on given prompts — a real generation (round time,
tokens per round, per-depth acceptance), then isolated timings of the pieces of a round replayed
on the final state (draft proposal, target forward over N tree nodes for a range of N, the plain AR
step), plus memory-bandwidth and byte-size facts for the byte floors. Replays of the draft and
verify forwards write only scratch cache slots past each row's length, so they are idempotent.

Byte facts by the model's config and modules, whatever the family (`StepProfile` applies them):
- weights (`streamed_bytes`, `touched_params`): every parameter and buffer but the RoPE tables and
  the embedding tables (the token table, Gemma-4's per-layer input table), of which a token reads
  one row; a mixture-of-experts target's routed experts are stored bytes of which a forward reads
  only the experts its tokens route to (`expert_sizes`; `StepProfile.weight_bytes`, through the
  union curve of `engine/experts.py`, measured on the profiled text);
- K/V (`kv_bytes_per_token`, `sliding_kv_bytes`): per layer that keeps K/V of its own (Gemma-4's
  KV-shared layers read another layer's), at its own K/V heads and head dim (Gemma-4's global
  layers); a sliding-window layer reads at most `sliding_window` positions
  (`StepProfile.kv_bytes_read`).

Does not own what to do with the numbers (`specpilot.loop.cost_model`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn

from specpilot.engine.experts import experts_read_at, measure_experts_read
from specpilot.engine.generator import Generator
from specpilot.engine.steps import tree_forward
from specpilot.engine.tree import DraftTree
from specpilot.models import ops
from specpilot.models.moe import Experts
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
    target_bytes: int  # weight bytes a target forward streams (MoE: with every routed expert; `weight_bytes`)
    drafter_bytes: int  # weight bytes streamed per draft forward
    kv_bytes_per_token: int  # target KV bytes per cached token (K and V, every layer keeping its own)
    bandwidth_gbps: float  # measured device copy bandwidth (GB/s, read + write)
    matmul_tflops: float  # measured dense matmul rate in the model's dtype
    target_params: int  # parameters touched per token (FLOPs per token ~ 2 x this; MoE: k of E experts)
    drafter_params: int
    draft_forwards: int  # draft-model forwards per round (catch-up + expansions)
    context: float  # mean cached tokens per row during the profiled generation
    head_params: int = 0  # of target_params, the lm_head's (left in BF16 by W12; 0: stored before)
    # recurrent layers (hybrid targets; 0 for dense ones or stored before): bytes a target forward
    # moves per row whatever its node count (the committed states and conv windows read), and per
    # node (each node's state written for the commit, its conv input)
    state_bytes_per_row: int = 0
    state_bytes_per_node: int = 0
    # sliding-window layers (Gemma; 0 for other targets or stored before): the part of
    # kv_bytes_per_token in layers that read at most `sliding_window` positions
    sliding_kv_bytes_per_token: int = 0
    sliding_window: int = 0
    # mixture-of-experts targets (0 and {} for dense ones or stored before): the routed experts of
    # every sparse layer (bytes, part of target_bytes; parameters, k/E of which are in target_params),
    # E and k, and the measured union curve: tokens per forward -> mean experts a sparse layer reads
    # ({}: uniform routing; `engine/experts.py`)
    expert_bytes: int = 0
    expert_params: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    expert_union: dict = field(default_factory=dict)

    @property
    def ms_per_token(self) -> float:
        return self.round_ms / self.tokens_per_round

    @property
    def active_expert_params(self) -> float:
        """Of `expert_params`, those a token multiplies: k of every E."""
        return self.expert_params * self.experts_per_token / self.num_experts if self.num_experts else 0.0

    def experts_read(self, tokens: float) -> float:
        """Experts one sparse layer reads in a forward over `tokens` tokens (the whole batch's):
        the measured union curve, else uniform routing's expectation (`experts.experts_read_at`)."""
        return experts_read_at(self.expert_union, self.num_experts, self.experts_per_token, tokens)

    def weight_bytes(self, tokens: float) -> float:
        """Weight bytes a target forward over `tokens` tokens streams: `target_bytes`, less the
        routed experts it does not read (a dense target: `target_bytes` at any count)."""
        if not self.num_experts:
            return float(self.target_bytes)
        return self.target_bytes - self.expert_bytes * (1.0 - self.experts_read(tokens) / self.num_experts)

    def kv_bytes_read(self, context: float) -> float:
        """K/V bytes a row's forward reads at `context` cached tokens: all of them in the layers that
        see the whole context, at most `sliding_window` in the sliding-window layers. That is the
        floor's count: today's cache keeps every position in every layer (`models/gemma.py`) and
        its attention reads the whole row with a mask, so a measured forward reads more."""
        sliding = self.sliding_kv_bytes_per_token
        window = min(context, self.sliding_window) if self.sliding_window else context
        return (self.kv_bytes_per_token - sliding) * context + sliding * window

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
    """Parameters a token multiplies, whatever their storage format: the config's count less the
    lookups (an untied token table, Gemma-4's per-layer input table) and, in each sparse layer,
    the routed experts the token does not route to (E - k of E)."""
    c = model.config
    lookups = (0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size) + (
        c.per_layer_input_vocab * c.num_layers * c.per_layer_input_size)
    unread = len(c.moe_layers) * (c.num_experts - c.num_experts_per_tok) * 3 * c.hidden_size * c.moe_intermediate_size
    return c.num_params - lookups - unread


def streamed_bytes(model: Transformer) -> int:
    """Weight bytes one forward may read: every parameter and buffer (packed W12 planes are buffers)
    but the RoPE tables and the embedding tables (a model's own, not one its lm_head reads whole),
    of which one row each is read. A mixture-of-experts model's every expert is counted
    (`expert_sizes`: what a forward leaves unread)."""
    total = 0
    for name, t in list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers() if "rope" not in n]:
        total += t.numel() * t.element_size()
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    for m in model.modules():  # feature-conditioned heads may share the target's table (none of their own)
        if isinstance(m, nn.Embedding) and m.weight is not head:
            e = m.weight
            total -= (e.numel() - e.shape[1]) * e.element_size()
    return total


def expert_sizes(model: Transformer) -> tuple[int, int]:
    """(bytes, parameters) of the routed experts of every sparse layer ((0, 0) for a dense model)."""
    experts = [t for m in model.modules() if isinstance(m, Experts) for t in (m.gate_up_proj, m.down_proj)]
    return sum(t.numel() * t.element_size() for t in experts), sum(t.numel() for t in experts)


def _cache_layers(config) -> tuple[int, ...]:
    """The attention layers that keep K/V of their own (a KV-shared layer reads another's)."""
    return tuple(sorted({config.kv_layers[i] for i in config.attention_layers}))


def kv_bytes_per_token(model: Transformer) -> int:
    """K and V bytes per cached token over the layers that keep their own, each at its K/V heads
    and head dim."""
    c = model.config
    return 2 * sum(c.layer_kv_heads[i] * c.layer_head_dims[i] for i in _cache_layers(c)) * model.dtype.itemsize


def sliding_kv_bytes(model: Transformer) -> tuple[int, int]:
    """(the part of `kv_bytes_per_token` in sliding-window layers, their window); (0, 0) without any."""
    c = model.config
    layers = [i for i in _cache_layers(c) if i in c.sliding_layers]
    if not layers:
        return 0, 0
    return 2 * sum(c.layer_kv_heads[i] * c.layer_head_dims[i] for i in layers) * model.dtype.itemsize, c.sliding_window


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
    one suffices: a full-length warm-up does not move the loop's cost table beyond its noise
    (`scripts/switch_estimates.py` measures both)."""
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
    depth = drafter.depth if drafter is not None else 0
    dmodel = drafter.model if drafter is not None else None
    c = gen.target.config
    expert_bytes, expert_params = expert_sizes(gen.target)
    # the routers on the decoded text, at the token counts of the curve's verify forwards
    union = measure_experts_read(gen.target, [p + o for p, o in zip(prompts, result.outputs)],
                                 tuple(sorted({1, *(n * B for n in curve_nodes)}))) if expert_params else {}
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
        sliding_kv_bytes_per_token=sliding_kv_bytes(gen.target)[0],
        sliding_window=sliding_kv_bytes(gen.target)[1],
        expert_bytes=expert_bytes,
        expert_params=expert_params,
        num_experts=c.num_experts if expert_params else 0,
        experts_per_token=c.num_experts_per_tok if expert_params else 0,
        expert_union=union,
    )
