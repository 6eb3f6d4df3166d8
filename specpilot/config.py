"""What to serve (`Deployment`) and how (`System`): frozen dataclasses with TOML in and out.

A *system file* holds the engine's knobs (`System`); it is what the benchmark runs, the controller
times and the loop proposes. A *deployment file* names the target, the drafter, their width
expansion, the format the target is loaded in, the serving regime, the benchmark sets and the
*stock* system. `stock` is the system taken from the deployment. Flags of the CLI map 1:1 onto
these fields.

Does not own loading models or running anything.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from importlib import resources
from pathlib import Path

from specpilot.errors import ConfigError


class DrafterKind(enum.Enum):
    MODEL = "model"  # the deployment's draft model
    NGRAM = "ngram"  # training-free prompt lookup
    DFLASH = "dflash"  # the deployment's DFlash block drafter (target-feature conditioned)
    EAGLE3 = "eagle3"  # the deployment's EAGLE-3 head (target-feature conditioned, best-first tree)
    NONE = "none"  # plain AR decoding


# the drafters with weights of their own, by the `Session` attribute holding each: what
# `draft_kernel` and `draft_compile` act on
DRAFTER_MODELS = {DrafterKind.MODEL: "drafter_model", DrafterKind.EAGLE3: "eagle3_model",
                  DrafterKind.DFLASH: "dflash_model"}


class TreeConstruction(enum.Enum):
    """How a block drafter (DFlash) turns its per-position distributions into a draft tree."""

    CHAIN = "chain"  # the argmax at each position: a chain of min(tree_budget, block_size - 1)
    BEST_FIRST = "best_first"  # DDTree: the tree_budget most probable prefixes
    SPINE_FIRST = "spine_first"  # the argmax chain first, then the most probable side branches


class Kernel(enum.Enum):
    CUBLAS = "cublas"  # torch F.linear
    TRITON = "triton"  # our Triton GEMV/GEMM (BF16, or W12 when w12 = true)
    # draft_kernel only: the draft model's decoder layers in four fused Triton kernels each
    # (`models.fused_decoder`); other drafters keep cuBLAS
    FUSED = "fused"


class TargetFormat(enum.Enum):
    """How the deployment's target holds its projections once loaded (`Deployment.target_format`)."""

    STORED = ""  # as the checkpoint stores them
    # FP8 e4m3 made at load time, after width expansion, by `specpilot fp8 convert`'s quantizer
    # (`models.fp8_checkpoint.quantize_model`): one scale per output row, or 128x128 blocks
    FP8_CHANNEL = "fp8-channel"
    FP8_BLOCK = "fp8-block"


class AttentionKernel(enum.Enum):
    """What attends over the KV cache in every cached forward (target and drafters)."""

    SDPA = "sdpa"  # torch's scaled_dot_product_attention (cuDNN / flash / efficient, torch's pick)
    SPLIT_KV = "split_kv"  # our Triton split-KV kernel (kernels/attention.py): few queries, long caches


# Drafters that take shared_budget and row_depth_margin (`System._check_batch_mechanisms`); NONE
# too, so that AR of such a system is one knob away.
BATCH_DRAFTERS = (DrafterKind.MODEL, DrafterKind.EAGLE3, DrafterKind.DFLASH, DrafterKind.NONE)


# Knobs that only speculative rounds read, at their off values: AR of a system resets them
# (`System.plain_ar`); segment admission rides in verify rows, which AR does not have.
SPECULATION_ONLY = {"adaptive_depth": (), "shared_budget": 0, "row_depth_margin": 0, "segment_tokens": 0,
                    "tlv_chain": 0}
# the drafters two-level verification can add its chain to (their trees are built on the device)
TLV_DRAFTERS = (DrafterKind.MODEL, DrafterKind.EAGLE3, DrafterKind.DFLASH)


@dataclass(frozen=True)
class System:
    """The engine's knobs. Defaults mirror SGLang's documented speculative defaults
    (speculative_num_steps=5, speculative_eagle_topk=4, speculative_num_draft_tokens=8, the last
    counting the verified root, so 7 draft tokens here)."""

    name: str = "stock"
    drafter: DrafterKind = DrafterKind.MODEL
    depth: int = 5  # K: draft steps per round
    topk: int = 4  # k: children per expanded node and frontier width (1 = chain)
    tree_budget: int = 7  # draft tokens verified per round (root excluded)
    draft_window: int = 0  # draft-model catch-up window; 0 = depth + 1 (always safe)
    adaptive_depth: tuple[int, ...] = ()  # depth tiers to switch among by recent acceptance
    ngram_max: int = 4  # longest n-gram the prompt-lookup drafter matches
    ngram_min: int = 1
    cuda_graphs: bool = True
    sync_every: int = 1  # decode rounds between host checks for EOS / max tokens
    w12: bool = False  # run projections from W12 weights (needs kernel = triton)
    kernel: Kernel = Kernel.CUBLAS
    kernel_lm_head: bool = False  # also route lm_head through `kernel`
    kernel_table: str = ""  # a tuned kernel table over the GPU's (a file, or a candidate id of the user cache)
    # The drafter's own projections, lm_head and feature fusion (a draft model, an EAGLE-3 head, a
    # DFlash drafter): cuBLAS, or our Triton kernels on its BF16 weights, choosing from
    # `kernel_table` over the GPU's table (`engine.session.with_draft_kernels`); the target's
    # projections (and the lm_head DFlash drafts through) are `kernel`'s. "fused": the draft model's
    # decoder layers in four fused kernels each (`models.fused_decoder`; few rows, CUDA or the
    # interpreter, else its plain forward); EAGLE-3 and DFlash keep cuBLAS.
    draft_kernel: Kernel = Kernel.CUBLAS
    fault: str = ""  # deliberate fault for guard testing (see specpilot.engine.faults)
    # DFlash drafts block_size - 1 tokens per round in one forward; depth, topk, draft_window and
    # adaptive_depth do not apply to it, tree_budget does (nodes of a best/spine-first tree).
    # EAGLE-3 drafts like the draft model (depth, topk, tree_budget, adaptive_depth) but catches up
    # from the target's features, so draft_window does not apply to it.
    block_size: int = 16  # DFlash: positions per drafted block (the root + block_size - 1 drafts)
    tree_construction: TreeConstruction = TreeConstruction.BEST_FIRST  # DFlash: chain or tree shape
    # In a batch (draft model, EAGLE-3, DFlash best-first or chain trees): the rows share
    # B x shared_budget draft nodes, split by path score (each row up to tree_budget), and
    # verification projects only those; 0 = tree_budget each.
    shared_budget: int = 0
    # Per-request depth (draft model, EAGLE-3, DFlash): each row drafts no deeper than the mean
    # accepted drafts of its last rounds + this margin (engine/selection.py; DFlash rounds it up to
    # a tier of 1/2, 3/4 or the whole block); 0 = off.
    row_depth_margin: int = 0
    # Continuous batching: a request admitted while others decode prefills inside the rounds, this
    # many prompt tokens per round in its verify rows (engine/segments.py); 0 = chunk prefills.
    segment_tokens: int = 0
    # Continuous batching: a round's target attention reads only the cache slots any row can reach
    # in it, rounded up to a multiple of this (a captured graph per span); 0 = the whole cache.
    attention_span: int = 256
    # A round's pieces under torch.compile with static shapes (`models.ops.compiled_static`): fewer,
    # fused kernels where they are launch bound. draft_compile: the proposal (every drafter but n-gram),
    # which changes drafts only, never the target's tokens; verify_compile: the target's verify
    # forward, acceptance and commit, or AR's step without a drafter (fused arithmetic may round
    # differently: the guard decides).
    # Triton projections (kernel = 'triton') stay one opaque op each (`kernels.op`). CUDA only
    # (eager elsewhere).
    draft_compile: bool = False
    verify_compile: bool = False
    # The cached attention of the target and the drafters (`AttentionKernel`). split_kv cuts the
    # cache into splits so that a call with few queries (decode, a drafter's frontier, a tree) fills
    # the GPU; CUDA only (or under TRITON_INTERPRET=1).
    attention: AttentionKernel = AttentionKernel.SDPA
    # Programmatic dependent launch (Hopper and later): our Triton kernels and inductor's start while
    # the kernel before them finishes, loading their weights, and wait for it before reading its
    # output (`kernels.launch.pdl`); CUDA only, the same arithmetic.
    pdl: bool = False
    # Each dense attention layer's q/k norm, RoPE and K/V cache write in one Triton kernel
    # (`kernels.rope_store`) instead of the fused op and two indexed writes, in the target's and the
    # draft model's eager and CUDA-graphed forwards (compiled ones keep the plain ops, which inductor
    # fuses); CUDA only (or under TRITON_INTERPRET=1); rounds within one ulp of the compiled op, so
    # the target's tokens may differ from stock's as a compiled verification's may: the guard decides.
    rope_store: bool = False
    # Two-level verification (`engine.drafters.two_level`): an 8-bit (FP8 e4m3 per-channel) view of
    # the target drafts a greedy chain of this many tokens beside the drafter's tree, and one verify
    # forward checks their union; 0 = off. The view's weights add 1 byte per projection weight.
    tlv_chain: int = 0

    def __post_init__(self):
        if self.drafter is not DrafterKind.NONE:
            if self.depth < 1:
                raise ConfigError(f"system {self.name!r}: depth must be >= 1 (got {self.depth})")
            if self.topk < 1:
                raise ConfigError(f"system {self.name!r}: topk must be >= 1 (got {self.topk})")
            if self.tree_budget < 1:
                raise ConfigError(f"system {self.name!r}: tree_budget must be >= 1 (got {self.tree_budget})")
            if self.tree_budget > 256:
                raise ConfigError(f"system {self.name!r}: tree_budget {self.tree_budget} is above the 256 supported")
        deepest = max((self.depth, *self.adaptive_depth))  # every tier drafts with the one window
        if self.draft_window and self.draft_window < deepest + 1:
            what = "depth" if deepest == self.depth else "the deepest adaptive_depth tier"
            raise ConfigError(
                f"system {self.name!r}: draft_window {self.draft_window} < {what} + 1 = {deepest + 1} "
                "would lose accepted tokens from the draft cache"
            )
        if self.sync_every < 1:
            raise ConfigError(f"system {self.name!r}: sync_every must be >= 1")
        if self.kernel is Kernel.FUSED:
            raise ConfigError(f"system {self.name!r}: kernel = 'fused' is not a projection kernel of the target: "
                              "'fused' is a value of draft_kernel only (the draft model's fused decoder layers); "
                              "kernel takes 'cublas' or 'triton'")
        if self.w12 and self.kernel is not Kernel.TRITON:
            raise ConfigError(f"system {self.name!r}: w12 = true needs kernel = 'triton'")
        if self.kernel_table and Kernel.TRITON not in (self.kernel, self.draft_kernel):
            raise ConfigError(f"system {self.name!r}: kernel_table needs kernel = 'triton' (or draft_kernel)")
        if not (1 <= self.ngram_min <= self.ngram_max):
            raise ConfigError(f"system {self.name!r}: need 1 <= ngram_min <= ngram_max")
        for d in self.adaptive_depth:
            if d < 1:
                raise ConfigError(f"system {self.name!r}: adaptive depth tiers must be >= 1")
        if self.shared_budget < 0:
            raise ConfigError(f"system {self.name!r}: shared_budget must be >= 0 (got {self.shared_budget})")
        if self.shared_budget > self.tree_budget:
            raise ConfigError(f"system {self.name!r}: shared_budget {self.shared_budget} > tree_budget "
                              f"{self.tree_budget} (a row's most)")
        if self.row_depth_margin < 0:
            raise ConfigError(f"system {self.name!r}: row_depth_margin must be >= 0 (got {self.row_depth_margin})")
        self._check_batch_mechanisms()
        if self.attention_span < 0 or self.attention_span % 64:
            raise ConfigError(f"system {self.name!r}: attention_span must be 0 or a positive multiple of 64 "
                              f"(got {self.attention_span})")
        if not (0 <= self.segment_tokens <= 256):
            raise ConfigError(f"system {self.name!r}: segment_tokens must be in 0..256 (got {self.segment_tokens})")
        if self.segment_tokens and self.drafter in (DrafterKind.NONE, DrafterKind.NGRAM):
            raise ConfigError(f"system {self.name!r}: segment_tokens rides in the verify forward: it needs drafter "
                              "= 'model', 'dflash' or 'eagle3'")
        if not (2 <= self.block_size <= 64):
            raise ConfigError(f"system {self.name!r}: block_size must be in 2..64 (got {self.block_size})")
        if not (0 <= self.tlv_chain <= 16):
            raise ConfigError(f"system {self.name!r}: tlv_chain must be in 0..16 (got {self.tlv_chain})")
        if self.tlv_chain and (self.drafter not in TLV_DRAFTERS or self.adaptive_depth):
            raise ConfigError(f"system {self.name!r}: tlv_chain adds a chain to a device drafter's tree: it needs "
                              "drafter = 'model', 'eagle3' or 'dflash' and no adaptive_depth tiers "
                              f"(got drafter = {self.drafter.value!r}, adaptive_depth = {list(self.adaptive_depth)})")

    def _check_batch_mechanisms(self) -> None:
        """shared_budget and row_depth_margin need a drafter whose trees are selected by path score:
        the draft model, EAGLE-3 or DFlash (shared_budget: not with spine-first trees)."""
        spine = self.drafter is DrafterKind.DFLASH and self.tree_construction is TreeConstruction.SPINE_FIRST
        for knob in ("shared_budget", "row_depth_margin"):
            if getattr(self, knob) and (self.drafter not in BATCH_DRAFTERS or (knob == "shared_budget" and spine)):
                got = f"drafter = {self.drafter.value!r}" + (", tree_construction = 'spine_first'" if spine else "")
                raise ConfigError(f"system {self.name!r}: {knob} needs drafter = 'model', 'eagle3' or 'dflash' "
                                  f"(dflash: shared_budget with a best_first or chain tree); got {got}")

    @property
    def window(self) -> int:
        """The draft model's catch-up window: every token a round can commit (a prompt segment's too)."""
        depths = (self.depth, *self.adaptive_depth)
        return max(self.draft_window or max(depths) + 1, self.segment_tokens + 1)

    @property
    def speculative(self) -> bool:
        return self.drafter is not DrafterKind.NONE

    def with_changes(self, **changes) -> "System":
        return replace(self, **changes)

    def plain_ar(self, name: str = "ar") -> "System":
        """This system with drafting off: the same engine, kernels and graphs decoding plain AR, with
        the knobs only speculation reads back at their defaults (`SPECULATION_ONLY`)."""
        return replace(self, name=name, drafter=DrafterKind.NONE, **SPECULATION_ONLY)

    def with_knobs(self, knobs: dict, name: str) -> "System":
        """This system with `knobs` (plain values, as `knobs()` gives them) laid over it, named `name`."""
        return System.from_dict({**self.knobs(), **knobs}, name=name)

    def knobs(self) -> dict:
        """Plain-JSON knob values (enums as strings), name excluded."""
        out = {}
        for f in fields(self):
            if f.name == "name":
                continue
            v = getattr(self, f.name)
            out[f.name] = v.value if isinstance(v, enum.Enum) else (list(v) if isinstance(v, tuple) else v)
        return out

    def diff(self, other: "System") -> dict:
        """Knobs of self that differ from other: {knob: [other's, self's]}."""
        a, b = other.knobs(), self.knobs()
        return {k: [a[k], b[k]] for k in b if a[k] != b[k]}

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(stable_knobs(self.knobs()), sort_keys=True).encode()).hexdigest()[:12]

    @classmethod
    def from_dict(cls, d: dict, name: str | None = None) -> "System":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown system knob(s): {', '.join(sorted(unknown))}")
        kw = dict(d)
        if name is not None:
            kw.setdefault("name", name)
        for knob, kind in (("drafter", DrafterKind), ("kernel", Kernel), ("draft_kernel", Kernel),
                           ("tree_construction", TreeConstruction), ("attention", AttentionKernel)):
            if knob in kw and not isinstance(kw[knob], kind):
                try:
                    kw[knob] = kind(kw[knob])
                except ValueError:
                    choices = ", ".join(k.value for k in kind)
                    raise ConfigError(f"system knob {knob}: {kw[knob]!r} is not one of {choices}") from None
        if "adaptive_depth" in kw:
            kw["adaptive_depth"] = tuple(int(x) for x in kw["adaptive_depth"])
        for f in fields(cls):
            if f.name in kw and f.type in ("int", "bool") and not isinstance(kw[f.name], (int, bool)):
                raise ConfigError(f"system knob {f.name} must be {f.type}, got {kw[f.name]!r}")
        return cls(**kw)

    def to_toml(self) -> str:
        lines = [f"name = {json.dumps(self.name)}"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in self.knobs().items()]
        return "\n".join(lines) + "\n"


_LATER_KNOBS = {"block_size": 16, "tree_construction": TreeConstruction.BEST_FIRST.value, "kernel_table": "",
                "shared_budget": 0, "row_depth_margin": 0, "segment_tokens": 0, "attention_span": 256,
                "draft_compile": False, "verify_compile": False, "attention": AttentionKernel.SDPA.value,
                "pdl": False, "draft_kernel": Kernel.CUBLAS.value, "tlv_chain": 0, "rope_store": False}


def stable_knobs(knobs: dict) -> dict:
    """`knobs` (a system's, by name) without the knobs added later that sit at their defaults: what
    every identity of a system hashes (`System.fingerprint`, the controller's `ArmSpec.fingerprint`),
    so a system, and the prompts and seeds drawn for it, stay what they were before a knob existed
    that it leaves alone."""
    return {k: v for k, v in knobs.items() if not (k in _LATER_KNOBS and v == _LATER_KNOBS[k])}


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_sampling(knobs: dict, where: str) -> None:
    """Refuse a bad sampling value with one line naming `where` ("regime", "sampling")."""
    t, k, p, m = (knobs[n] for n in ("temperature", "top_k", "top_p", "min_p"))
    if not _is_number(t) or not math.isfinite(t) or t < 0:
        raise ConfigError(f"{where} temperature must be a finite number >= 0, 0 = greedy (got {t!r})")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ConfigError(f"{where} top_k must be an integer >= 0, 0 = off (got {k!r})")
    if not _is_number(p) or not 0 < p <= 1:
        raise ConfigError(f"{where} top_p must be in (0, 1], 1 = off (got {p!r})")
    if not _is_number(m) or not 0 <= m <= 1:
        raise ConfigError(f"{where} min_p must be in [0, 1], 0 = off (got {m!r})")


@dataclass(frozen=True)
class Sampling:
    """How a deployment's requests sample: temperature, top-k, top-p, min-p, as
    `engine.sampling.SamplingParams` takes them (the order of its module docstring); the defaults
    are greedy. Each request gets its own seed from whoever serves it (`engine.runner.sampling_params`)."""

    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off

    def __post_init__(self):
        check_sampling(asdict(self), "sampling")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def set_knobs(self) -> dict:
        """The knobs away from their defaults (greedy: {})."""
        return {k: v for k, v in asdict(self).items() if v != SAMPLING_DEFAULTS[k]}

    def describe(self) -> str:
        """"greedy", or "sampled: temperature 0.7, top-p 0.95" (only the filters that are on)."""
        if self.greedy:
            return "greedy"
        names = {"temperature": "temperature", "top_k": "top-k", "top_p": "top-p", "min_p": "min-p"}
        return "sampled: " + ", ".join(f"{names[k]} {v:g}" for k, v in self.set_knobs().items())

    def to_dict(self) -> dict:
        return {**asdict(self), "greedy": self.greedy}


SAMPLING_DEFAULTS = {f.name: f.default for f in fields(Sampling)}


@dataclass(frozen=True)
class Regime:
    batch: int = 1  # concurrent requests decoded together
    # True: the requests are served by continuous batching in `batch` slots (closed loop: a finished
    # request's slot takes the next at once, engine/serving.py); False: static batches of `batch`.
    continuous: bool = False
    # How every request samples (`Sampling`); the defaults are greedy. A sampled regime is benched
    # under sampling, timed with fixed seeds per request pair and judged by the sampling guard.
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self):
        if self.batch < 1:
            raise ConfigError(f"regime batch must be >= 1 (got {self.batch})")
        if not isinstance(self.continuous, bool):
            raise ConfigError(f"regime continuous must be true or false (got {self.continuous!r})")
        check_sampling({k: getattr(self, k) for k in SAMPLING_DEFAULTS}, "regime")

    @property
    def sampling(self) -> Sampling:
        return Sampling(**{k: getattr(self, k) for k in SAMPLING_DEFAULTS})

    @property
    def sampled(self) -> bool:
        return not self.sampling.greedy

    def to_dict(self) -> dict:
        """The [regime] table: batch and continuous, and the sampling knobs that are set."""
        return {"batch": self.batch, "continuous": self.continuous, **self.sampling.set_knobs()}

    @classmethod
    def from_dict(cls, d: dict, source: str = "") -> "Regime":
        if not isinstance(d, dict):
            raise ConfigError(f"{source or 'deployment'}: [regime] must be a table")
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ConfigError(f"{source or 'deployment'}: unknown regime field(s) {', '.join(sorted(unknown))}")
        return cls(**d)


BENCHMARK_SETS = ("gsm8k", "math500", "humaneval", "mbpp", "mt_bench")
# The project's own prompts, never shown to the loop: only its final measurement benchmarks them.
HELDOUT_SET = "heldout"


@dataclass(frozen=True)
class Deployment:
    name: str
    target: str  # model directory, or "fixture" for the shipped target
    drafter: str = "fixture"  # draft model directory, "fixture", or "ngram" / "none"
    target_expand: int = 1  # exact width expansion factor applied at load (power of two)
    drafter_expand: int = 1
    # A DFlash drafter directory (or "fixture-dflash") loaded beside `drafter`, so systems may
    # draft with either; it is widened to the target's width (trained for the unwidened target).
    dflash: str = ""
    eagle3: str = ""  # likewise an EAGLE-3 head directory (or "fixture-eagle3")
    # The target's projections as loaded (`TargetFormat`; a string in files): an FP8 format makes the
    # widened target an FP8 model at load time, and that FP8 model is the reference every system,
    # AR and the guard decode and score with. Drafters keep their precision.
    target_format: TargetFormat = TargetFormat.STORED
    # "ExK" (e.g. "16x2"): the dense target upcycled at load into a mixture of E identical copies of
    # each layer's MLP, k routed per token by a seeded random router (`models.upcycle`): the dense
    # model's function up to rounding, with an MoE's routing, union of experts and bytes. "": as stored.
    target_experts: str = ""
    regime: Regime = field(default_factory=Regime)
    sets: tuple[str, ...] = BENCHMARK_SETS
    max_new_tokens: int = 2048
    n_prompts: int = 10
    stock: System = field(default_factory=System)
    source: str = ""  # file it was read from

    def __post_init__(self):
        if not isinstance(self.target_format, TargetFormat):  # a file's (or a caller's) string
            try:
                object.__setattr__(self, "target_format", TargetFormat(self.target_format))
            except ValueError:
                choices = ", ".join(repr(f.value) for f in TargetFormat)
                raise ConfigError(f"deployment {self.name!r}: target_format {self.target_format!r} is not one of "
                                  f"{choices} ('': as stored)") from None
        if self.target_experts:
            parse_experts(self.target_experts, f"deployment {self.name!r}")
            if self.target_format is not TargetFormat.STORED:
                raise ConfigError(f"deployment {self.name!r}: target_experts and target_format together are not "
                                  "supported (upcycle a dense target, or quantize one)")
        self.check_format(self.stock, f"deployment {self.name!r}: its stock system")
        for factor in (self.target_expand, self.drafter_expand):
            if factor < 1 or factor & (factor - 1):
                raise ConfigError(f"deployment {self.name!r}: expansion factors must be powers of two (got {factor})")
        if HELDOUT_SET in self.sets:
            raise ConfigError(f"deployment {self.name!r}: the held-out set {HELDOUT_SET!r} cannot be one of its sets: "
                              "it is never shown to the loop, and the final measurement benchmarks it "
                              "(loop option final_heldout_prompts)")
        bad = [s for s in self.sets if s not in BENCHMARK_SETS]
        if bad:
            raise ConfigError(f"deployment {self.name!r}: unknown benchmark set(s) {bad} (known: {list(BENCHMARK_SETS)})")
        if self.max_new_tokens < 1:
            raise ConfigError(f"deployment {self.name!r}: max_new_tokens must be >= 1")

    def check_format(self, system: System, where: str) -> None:
        """`system` on this deployment's target format: W12 (a lossless format of BF16 weights) on a
        target made FP8 at load is one error line, said from `where` (a stored FP8 checkpoint is
        found at session build: `engine.session.with_kernels`)."""
        if system.w12 and self.target_format is not TargetFormat.STORED:
            raise ConfigError(f"{where}: w12 = true, and deployment {self.name!r} has target_format "
                              f"{self.target_format.value!r}, which makes the target FP8: W12 is a lossless format "
                              "of BF16 weights")

    def fingerprint_fields(self) -> dict:
        d = asdict(self)
        d.pop("source")
        d["target_format"] = self.target_format.value
        # added later: unset, they leave earlier fingerprints as they were
        for later in ("dflash", "eagle3", "target_format", "target_experts"):
            if not d[later]:
                del d[later]
        for knob, default in SAMPLING_DEFAULTS.items():  # likewise: a greedy regime keeps its fingerprint
            if d["regime"][knob] == default:
                del d["regime"][knob]
        d["stock"] = self.stock.knobs()
        return d

    @classmethod
    def from_toml(cls, path: str | Path) -> "Deployment":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: deployment file does not exist")
        try:
            d = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path}: not valid TOML ({err})") from None
        return cls.from_dict(d, source=str(path))

    @classmethod
    def from_dict(cls, d: dict, source: str = "") -> "Deployment":
        d = dict(d)
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"{source or 'deployment'}: unknown field(s) {', '.join(sorted(unknown))}")
        if "name" not in d or "target" not in d:
            raise ConfigError(f"{source or 'deployment'}: needs at least 'name' and 'target'")
        base = Path(source).parent if source else None
        for key in ("target", "drafter", "dflash", "eagle3"):
            v = d.get(key)
            if base and isinstance(v, str) and v and not _shipped_name(v) and not Path(v).is_absolute():
                d[key] = str((base / v).resolve())
        d["regime"] = Regime.from_dict(d.get("regime", {}), source)
        d["stock"] = System.from_dict(d.get("stock", {}), name="stock")
        if "sets" in d:
            d["sets"] = tuple(d["sets"])
        return cls(**d, source=source)

    def to_toml(self) -> str:
        """This deployment as a deployment file (`from_toml` reads it back equal, `source` aside):
        model paths as given (absolute once read from a file), target_format and target_experts when set, the [regime]
        table with its set sampling knobs only, and the stock's every knob."""
        lines = [f"name = {json.dumps(self.name)}", f"target = {json.dumps(self.target)}",
                 f"drafter = {json.dumps(self.drafter)}"]
        lines += [f"{k} = {json.dumps(getattr(self, k))}" for k in ("dflash", "eagle3") if getattr(self, k)]
        if self.target_format is not TargetFormat.STORED:
            lines.append(f"target_format = {json.dumps(self.target_format.value)}")
        if self.target_experts:
            lines.append(f"target_experts = {json.dumps(self.target_experts)}")
        lines += [f"target_expand = {self.target_expand}", f"drafter_expand = {self.drafter_expand}",
                  f"sets = {json.dumps(list(self.sets))}", f"max_new_tokens = {self.max_new_tokens}",
                  f"n_prompts = {self.n_prompts}", "", "[regime]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in self.regime.to_dict().items()]
        lines += ["", "[stock]"] + [f"{k} = {json.dumps(v)}" for k, v in self.stock.knobs().items()]
        return "\n".join(lines) + "\n"


def parse_experts(spec: str, where: str) -> tuple[int, int]:
    """(E, k) of a `target_experts` value "ExK": 2 <= E <= 256 experts, 1 <= k <= E routed per token."""
    parts = spec.lower().split("x")
    try:
        E, k = (int(v) for v in parts)
    except ValueError:
        E = k = 0
    if len(parts) != 2 or not (2 <= E <= 256 and 1 <= k <= E):
        raise ConfigError(f"{where}: target_experts {spec!r} must be 'ExK' with 2 <= E <= 256 experts and 1 <= k <= E "
                          "routed per token (e.g. '16x2')")
    return E, k


def _shipped_name(spec: str) -> bool:
    """A model name that is not a path: the shipped fixture, its feature drafters, ngram, none."""
    return spec in ("fixture", "ngram", "none") or spec.startswith("fixture-")


def shipped_deployments_dir() -> Path:
    """The repository's deployments/ (source checkout) or the copy inside the package."""
    repo = Path(__file__).resolve().parents[1] / "deployments"
    if repo.is_dir():
        return repo
    return Path(str(resources.files("specpilot") / "data" / "deployments"))


def load_deployment(name_or_path: str | None) -> Deployment:
    """A deployment by file path or by shipped name; None means the default, `fixture`."""
    name_or_path = name_or_path or "fixture"
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        return Deployment.from_toml(p)
    candidate = shipped_deployments_dir() / f"{name_or_path}.toml"
    if candidate.is_file():
        return Deployment.from_toml(candidate)
    raise ConfigError(f"deployment {name_or_path!r} is neither a file nor a shipped deployment")


def load_system(spec: str | None, deployment: Deployment) -> System:
    """A system by file path, or by name: 'stock' (the deployment's) or 'ar' (no drafting); W12
    on an FP8 `target_format` is an error."""
    if spec in (None, "stock"):
        return deployment.stock
    if spec == "ar":
        return deployment.stock.plain_ar()
    p = Path(spec)
    if not p.is_file():
        raise ConfigError(f"system {spec!r} is neither 'stock', 'ar' nor an existing file")
    try:
        d = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{p}: not valid TOML ({err})") from None
    system = deployment.stock.with_knobs(d, d.get("name", p.stem))
    deployment.check_format(system, str(p))
    return system
