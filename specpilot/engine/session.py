"""A loaded deployment: target, drafter and tokenizer on a device, and generators per system.

Owns: resolving model names ("fixture", directories), width expansion and the target's format
(`Deployment.target_format`) at load, the drafter / target vocabulary check, and turning a
`System` (the engine's knobs) into a `Generator` — with the projection kernels, the attention
kernel and the rope_store kernel the system asks for applied to *clones* of the target and the
drafters that share their tensors, so AR and any number of systems can run side by side in one
process.

Does not own the decode loop (`generator.py`) or the kernels (`specpilot.kernels`, `specpilot.w12`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specpilot import env
from specpilot.config import DRAFTER_MODELS, AttentionKernel, Deployment, DrafterKind, Kernel, System, TargetFormat
from specpilot.engine.drafters.dflash import DFlashDrafter
from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.drafters.eagle3 import Eagle3Drafter
from specpilot.engine.drafters.two_level import TwoLevelDrafter
from specpilot.engine.drafters.ngram import NgramDrafter
from specpilot.engine.generator import Generator
from specpilot.errors import CheckpointError, ConfigError
from specpilot.kernels import launch
from specpilot.models.dflash import DFlashModel
from specpilot.models.dflash_checkpoint import is_dflash_dir, load_dflash
from specpilot.models.eagle3 import Eagle3Model
from specpilot.models.eagle3_checkpoint import is_eagle3_dir, load_eagle3
from specpilot.models.config import ModelConfig
from specpilot.models.fixture import resolve_checkpoint
from specpilot.models.fp8_linear import FP8Linear
from specpilot.models import ops
from specpilot.models.loading import load_model
from specpilot.models.tokenizer import Tokenizer, check_same_vocabulary
from specpilot.models.transformer import Transformer, use_attention, use_rope_store


def resolve_model_dir(name: str, role: str) -> Path:
    """'fixture' -> the shipped checkpoint for `role` ("target" | "drafter"); else a directory."""
    return resolve_checkpoint(name, role)


def load_role(name: str, role: str, factor: int, device, dtype) -> Transformer:
    path = resolve_model_dir(name, role)
    if factor == 1:
        return load_model(path, device=device, dtype=dtype)
    from specpilot.models.expand import load_expanded

    return load_expanded(path, factor, device=device, dtype=dtype)


def load_target(deployment: Deployment, device, dtype) -> Transformer:
    """The deployment's target, widened by `target_expand`, upcycled into `target_experts` identical
    experts (`models.upcycle`) and held in `target_format`. An FP8
    format quantizes the widened target as `specpilot fp8 convert` quantizes a checkpoint
    (`models.fp8_checkpoint.quantize_model`), from float32 on the host (the precision any stored
    one fits in), then moves it to `device`; that FP8 model is the session's only target."""
    if deployment.target_experts:
        from specpilot.config import parse_experts
        from specpilot.models.upcycle import upcycle

        dense = load_role(deployment.target, "target", deployment.target_expand, device, dtype)
        return upcycle(dense, *parse_experts(deployment.target_experts, f"deployment {deployment.name!r}"))
    if deployment.target_format is TargetFormat.STORED:
        return load_role(deployment.target, "target", deployment.target_expand, device, dtype)
    from specpilot.models.fp8_checkpoint import quantize_model

    wide = load_role(deployment.target, "target", deployment.target_expand, "cpu", torch.float32)
    return quantize_model(wide, deployment.target_format is TargetFormat.FP8_CHANNEL, device, dtype,
                          f"deployment {deployment.name!r} (target_format = {deployment.target_format.value!r})")


def fp8_target(deployment: Deployment) -> bool:
    """Whether `load_target` gives `deployment` an FP8 target: an FP8 `target_format`, or a stored
    FP8 checkpoint (a `quantization_config` in its config.json). Its projections are `FP8Linear`
    modules, run by the FP8 kernels: `kernel = "triton"` reaches only a BF16 lm_head, and W12 (a
    lossless format of BF16 weights) has nothing to encode."""
    if deployment.target_format is not TargetFormat.STORED:
        return True
    from specpilot.models.fp8_checkpoint import fp8_scheme, read_config_json

    try:
        path = resolve_model_dir(deployment.target, "target")
        return fp8_scheme(read_config_json(path), str(path)) is not None
    except (CheckpointError, ConfigError, OSError):  # a missing or unreadable target fails loudly at load
        return False


def _shared_clone(model):
    """A copy of `model`'s modules that shares every parameter and buffer with it."""
    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return copy.deepcopy(model, memo)


def _check_triton_device(device: torch.device, system: System, setting: str) -> None:
    """Our Triton kernels run on CUDA, or on CPU under the interpreter: elsewhere `setting` is an error."""
    if device.type != "cuda" and not env.triton_interpret():
        raise ConfigError(f"system {system.name!r}: {setting} needs a CUDA device (or TRITON_INTERPRET=1)")


def ran_on_device(system: System, device: str | torch.device) -> dict[str, tuple[object, str]]:
    """The knobs of `system` that do not run as set on `device`, each as (what ran, why), by the
    engine's rules: CUDA graphs are captured on CUDA only (`Generator.use_graphs`), else each round
    runs eagerly; a compiled verification or proposal is compiled only where
    `models.ops.compiled_static` compiles (CUDA, and SPECPILOT_COMPILE not 0), else eager; PDL is a
    CUDA launch attribute (`kernels.launch.pdl`); kernel = "cublas" (and a drafter model's
    draft_kernel) is torch's F.linear, which off CUDA is torch's own matmul, not cuBLAS; draft_kernel =
    "fused" runs the draft model's fused layers on CUDA or under the interpreter only, and rope_store's
    kernel runs only there too (a session refuses it elsewhere, as it does split-KV attention). Empty for a
    system that runs as set. For showing what ran: the system (its knobs, its fingerprint) is what
    the memory keeps, and runs as set on a GPU."""
    device = torch.device(device)
    cuda, drafts = device.type == "cuda", system.drafter in DRAFTER_MODELS
    out: dict[str, tuple[object, str]] = {}
    if system.cuda_graphs and not cuda:
        out["cuda_graphs"] = (False, "CUDA graphs are captured on CUDA only: each round ran eagerly")
    if ops.STATIC_BACKEND == "inductor" and not ops.fusion_enabled(device):
        for knob, on in (("verify_compile", system.verify_compile), ("draft_compile", system.draft_compile and drafts)):
            if on:
                out[knob] = (False, "torch.compile runs on CUDA only, and not with SPECPILOT_COMPILE=0: eager")
    if system.pdl and not cuda:
        out["pdl"] = (False, "programmatic dependent launch is a CUDA launch attribute")
    if system.draft_kernel is Kernel.FUSED and drafts and system.drafter is not DrafterKind.MODEL:
        out["draft_kernel"] = ("cublas", ("the fused decoder layers are the draft model's: this drafter's "
                                          "projections ran on F.linear"))
    elif system.draft_kernel is Kernel.FUSED and drafts and not cuda and not env.triton_interpret():
        out["draft_kernel"] = ("torch", ("the fused draft layers run on CUDA (or under TRITON_INTERPRET=1): "
                                         "the draft model's plain forward ran"))
    if system.rope_store and not cuda and not env.triton_interpret():
        out["rope_store"] = (False, ("the rope_store kernel runs on CUDA (or under TRITON_INTERPRET=1): the fused "
                                     "op and the indexed cache writes ran"))
    if not cuda:
        matmul = "F.linear off CUDA is torch's own matmul, not cuBLAS"
        for knob, on in (("kernel", True), ("draft_kernel", drafts)):
            if on and getattr(system, knob) is Kernel.CUBLAS:
                out[knob] = ("torch", matmul)
    return out


def with_attention(model, system: System):
    """The model itself for SDPA; otherwise a clone sharing every tensor whose cached attention runs
    the system's kernel (`models.transformer.use_attention`). None stays None."""
    if model is None or system.attention is AttentionKernel.SDPA:
        return model
    _check_triton_device(next(model.parameters()).device, system, f"attention = {system.attention.value!r}")
    clone = _shared_clone(model)
    use_attention(clone, system.attention)
    return clone


def with_rope_store(model, system: System):
    """The model itself unless the system sets `rope_store`; then a clone sharing every tensor whose
    dense attention layers run q/k norm, RoPE and the cache write in one kernel
    (`models.transformer.use_rope_store`). Only a dense `Transformer` (a draft model, the target, its
    8-bit view) reads it; other models, and None, stay as they are."""
    if model is None or not system.rope_store or not isinstance(model, Transformer):
        return model
    _check_triton_device(model.device, system, "rope_store = true")
    clone = _shared_clone(model)
    use_rope_store(clone, True)
    return clone


def _swapped(model, system: System, setting: str, w12: bool, lm_head: bool, heads: tuple[str, ...] = ()):
    """A clone sharing every tensor, its projections (and `lm_head`, and `heads`) on our kernels
    reading the system's `kernel_table`; `setting` names the knob in the error off a GPU."""
    _check_triton_device(model.device, system, setting)
    from specpilot.kernels.dispatch import device_name
    from specpilot.models.linear import swap_projections

    table_notice(system.kernel_table, device_name(model.device))

    clone = _shared_clone(model)
    swap_projections(clone, w12=w12, lm_head=lm_head, table=system.kernel_table, heads=heads)
    for module in clone.modules():  # W12Linear modules of a W12 checkpoint were there before the swap
        if hasattr(module, "table"):
            module.table = system.kernel_table
    return clone


def table_notice(table: str, gpu: str) -> None:
    """A `Notice` when a `kernel_table` gives this process nothing to read on GPU `gpu` (a missing
    file: a run resumed on another machine, a moved home; or one tuned under other software
    versions): its projections then choose from the GPU's tuned table alone. Nothing on CPU,
    where no table is read."""
    if not table or not gpu:
        return
    import warnings

    from specpilot.errors import Notice
    from specpilot.kernels import user_cache
    from specpilot.kernels.configs import device_slug

    path = user_cache.resolve(table, device_slug(gpu))
    if user_cache.read_document(path) is not None:
        return
    why = "there is no such file" if not path.is_file() else "it is unreadable or was tuned under other software versions"
    warnings.warn(f"kernel_table {table!r}: {why} ({path}); the projections choose from {gpu}'s tuned "
                  "table alone", Notice, stacklevel=3)


def with_kernels(model: Transformer, system: System) -> Transformer:
    """The model itself for cuBLAS; otherwise a clone sharing every tensor, projections swapped.
    W12 on an FP8 target is an error (it would leave the FP8 projections as they are)."""
    if system.w12 and any(isinstance(m, FP8Linear) for m in model.modules()):
        raise ConfigError(f"system {system.name!r}: w12 = true needs a BF16 target, and this one is FP8 "
                          "(target_format, or an FP8 checkpoint): W12 is a lossless format of BF16 weights")
    if system.kernel is Kernel.CUBLAS:
        return model
    return _swapped(model, system, "kernel = 'triton'", system.w12, system.kernel_lm_head)


def with_draft_kernels(model, system: System):
    """The drafter's own model (a draft model, an EAGLE-3 head, a DFlash drafter) itself for cuBLAS
    (`draft_kernel`); for "triton" a clone sharing every tensor whose projections, lm_head and feature
    fusion (`fc`) run our Triton kernels on its weights, choosing from the system's `kernel_table`;
    for "fused" the draft model's fused decoder layers (`_fused`).
    (DFlash drafts through the target's lm_head, which `kernel` decides.) None stays None."""
    if model is None or system.draft_kernel is Kernel.CUBLAS:
        return model
    if system.draft_kernel is Kernel.FUSED:
        return _fused(model)
    return _swapped(model, system, "draft_kernel = 'triton'", w12=False, lm_head=True, heads=("fc",))


def _fused(model):
    """For a dense draft model, a clone sharing every tensor whose decoder layers run the fused
    kernels (`models.fused_decoder`; its plain forward where they do not apply, off CUDA among
    them); other drafters (EAGLE-3, DFlash) are returned as they are."""
    from specpilot.models.fused_decoder import supported, use_fused_layers

    if type(model) is not Transformer or not supported(model):
        return model
    return use_fused_layers(_shared_clone(model))


def _load_beside(deployment: Deployment, kind: str, is_kind, load, target, device, dtype):
    """The feature-conditioned drafter a deployment names in field `kind`, widened to the target's
    width (it was trained for the target at width target / target_expand)."""
    spec = getattr(deployment, kind)
    path = resolve_model_dir(spec, f"{kind} drafter")
    if not is_kind(path):
        raise CheckpointError(f"deployment {deployment.name!r}: {kind} = {spec!r} is not a {kind} drafter directory")
    return load(path, target, device, dtype, factor=deployment.target_expand)  # a width mismatch is one error line


def system_target(model, system: System):
    """`model` as `system` runs it: its projections on the system's kernels, its cached attention on
    the system's kernel and its q/k norm, RoPE and cache write as `rope_store` says (clones sharing
    every tensor where any differs from `model`'s)."""
    return with_rope_store(with_attention(with_kernels(model, system), system), system)


def system_generator(target, system: System, drafters: dict | None = None, eos_ids: tuple[int, ...] = ()) -> Generator:
    """A generator running `system`'s round settings (graphs, host syncs, compile, PDL, ...) over
    `target` (`system_target`) and `drafters` (None: plain AR). Built inside the system's PDL scope
    where compiled pieces are built (`Session._build`)."""
    return Generator(target, drafters, eos_ids=eos_ids, cuda_graphs=system.cuda_graphs, sync_every=system.sync_every,
                     fault=system.fault or None, segment_tokens=system.segment_tokens,
                     attention_span=system.attention_span, verify_compile=system.verify_compile, pdl=system.pdl)


@dataclass
class Session:
    """Models of one deployment loaded once; `generator(system)` is cheap after the first call."""

    deployment: Deployment
    target: Transformer
    drafter_model: Transformer | None
    tokenizer: Tokenizer
    eos_ids: tuple[int, ...]
    dflash_model: DFlashModel | None = None  # when the deployment's drafter is a DFlash directory
    eagle3_model: Eagle3Model | None = None  # when it is an EAGLE-3 head directory
    _generators: dict = field(default_factory=dict)
    _targets: dict = field(default_factory=dict)
    _drafter_models: dict = field(default_factory=dict)  # (role, attention) -> the drafter's model for it

    @classmethod
    def load(cls, deployment: Deployment, device: str | torch.device | None = None,
             dtype: torch.dtype | None = None) -> "Session":
        device = env.resolve_device(device)  # a device this torch cannot use is one `error:` line
        dtype = dtype or env.default_dtype(device)
        target = load_target(deployment, device, dtype)
        tokenizer = Tokenizer.from_dir(resolve_model_dir(deployment.target, "target"), target.config.eos_token_ids)
        drafter = dflash = eagle3 = None
        path = resolve_model_dir(deployment.drafter, "drafter") if deployment.drafter not in ("ngram", "none") else None
        if path is not None and is_dflash_dir(path):
            dflash = load_dflash(path, target, device, dtype, factor=deployment.drafter_expand)
        elif path is not None and is_eagle3_dir(path):
            eagle3 = load_eagle3(path, target, device, dtype, factor=deployment.drafter_expand)
        elif path is not None:
            if ModelConfig.from_dir(path).hybrid:
                raise CheckpointError(
                    f"drafter {deployment.drafter!r} is a hybrid (recurrent) model: a draft model re-reads its last "
                    "tokens every round, which a recurrent state cannot undo; draft with a dense model, an EAGLE-3 "
                    "head, DFlash or ngram")
            drafter = load_role(deployment.drafter, "drafter", deployment.drafter_expand, device, dtype)
            d_tok = Tokenizer.from_dir(resolve_model_dir(deployment.drafter, "drafter"))
            check_same_vocabulary(tokenizer, d_tok)
            if drafter.config.vocab_size != target.config.vocab_size:
                raise CheckpointError(
                    f"drafter vocab_size {drafter.config.vocab_size} != target vocab_size {target.config.vocab_size}"
                )
        if deployment.dflash:
            if dflash is not None:
                raise ConfigError(f"deployment {deployment.name!r}: drafter and dflash both name a DFlash drafter")
            dflash = _load_beside(deployment, "dflash", is_dflash_dir, load_dflash, target, device, dtype)
        if deployment.eagle3:
            if eagle3 is not None:
                raise ConfigError(f"deployment {deployment.name!r}: drafter and eagle3 both name an EAGLE-3 head")
            eagle3 = _load_beside(deployment, "eagle3", is_eagle3_dir, load_eagle3, target, device, dtype)
        eos = tuple(sorted(set(target.config.eos_token_ids) | set(tokenizer.eos_ids)))
        return cls(deployment, target, drafter, tokenizer, eos, dflash, eagle3)

    @property
    def device(self) -> torch.device:
        return self.target.device

    def generator(self, system: System) -> Generator:
        key = system.fingerprint()
        gen = self._generators.get(key)
        if gen is None:
            gen = self._build(system)
            self._generators[key] = gen
        return gen

    def forget(self, fingerprint: str) -> None:
        """Drop the generator of the system with this fingerprint (its workspaces and graphs)."""
        self._generators.pop(fingerprint, None)

    def _target_for(self, system: System) -> Transformer:
        key = (system.kernel, system.w12, system.kernel_lm_head, system.kernel_table, system.attention,
               system.rope_store)
        if key not in self._targets:
            self._targets[key] = system_target(self.target, system)
        return self._targets[key]

    def _drafter_for(self, kind: DrafterKind, system: System):
        """The session's draft model, EAGLE-3 head or DFlash drafter (`kind`, one of
        `DRAFTER_MODELS`) with the system's attention, `draft_kernel` and (a draft model) `rope_store`."""
        kernels = (system.draft_kernel, system.kernel_table if system.draft_kernel is Kernel.TRITON else "")
        key = (kind, system.attention, *kernels, system.rope_store)
        if key not in self._drafter_models:
            model = getattr(self, DRAFTER_MODELS[kind])
            self._drafter_models[key] = with_rope_store(with_attention(with_draft_kernels(model, system), system),
                                                        system)
        return self._drafter_models[key]

    def view_for(self, system: System):
        """The target's 8-bit view (`models.view`) with the system's attention and `rope_store`, built once."""
        from specpilot.models.view import fp8_view

        key = ("fp8_view", system.attention, system.rope_store)
        if key not in self._drafter_models:
            base = self._drafter_models.get(("fp8_view", AttentionKernel.SDPA, False))
            if base is None:
                base = self._drafter_models["fp8_view", AttentionKernel.SDPA, False] = fp8_view(self.target)
            self._drafter_models[key] = with_rope_store(with_attention(base, system), system)
        return self._drafter_models[key]

    def _build(self, system: System) -> Generator:
        with launch.knob_scope(system.pdl):  # compiled proposals: inductor launches as ours
            return self._build_in_scope(system)

    def _build_in_scope(self, system: System) -> Generator:
        target = self._target_for(system)
        drafters = {}
        tiers = sorted({system.depth, *system.adaptive_depth})
        if system.drafter is DrafterKind.MODEL:
            if self.drafter_model is None:
                raise ConfigError(
                    f"system {system.name!r} drafts with a model but deployment "
                    f"{self.deployment.name!r} has drafter = {self.deployment.drafter!r}"
                )
            model = self._drafter_for(DrafterKind.MODEL, system)
            for d in tiers:
                drafters[d] = DraftModelDrafter(model, d, system.topk, system.tree_budget, system.window,
                                                system.shared_budget, system.row_depth_margin, system.draft_compile)
        elif system.drafter is DrafterKind.DFLASH:
            if self.dflash_model is None:
                raise ConfigError(
                    f"system {system.name!r} drafts with DFlash but deployment {self.deployment.name!r} "
                    f"has drafter = {self.deployment.drafter!r}, not a DFlash drafter directory"
                )
            drafters[system.block_size - 1] = DFlashDrafter(
                self._drafter_for(DrafterKind.DFLASH, system), target, system.block_size, system.tree_budget,
                system.tree_construction, system.shared_budget, system.row_depth_margin, system.draft_compile,
            )
        elif system.drafter is DrafterKind.EAGLE3:
            if self.eagle3_model is None:
                raise ConfigError(
                    f"system {system.name!r} drafts with EAGLE-3 but deployment {self.deployment.name!r} "
                    f"has drafter = {self.deployment.drafter!r}, not an EAGLE-3 head directory"
                )
            head = self._drafter_for(DrafterKind.EAGLE3, system)
            for d in tiers:  # the tiers share one head cache (`Drafter.share_caches`)
                drafters[d] = Eagle3Drafter(head, target, d, system.topk, system.tree_budget, system.shared_budget,
                                            system.row_depth_margin, system.draft_compile)
        elif system.drafter is DrafterKind.NGRAM:
            for d in tiers:
                drafters[d] = NgramDrafter(d, system.topk, system.tree_budget, system.ngram_min, system.ngram_max)
        if system.tlv_chain:  # one tier (`System` checks): its tree plus the view's chain
            (tier, inner), = drafters.items()
            drafters = {tier: TwoLevelDrafter(inner, self.view_for(system), system.tlv_chain)}
        return system_generator(target, system, drafters, self.eos_ids)

    def encode_prompt(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text)
        if not ids:
            raise ConfigError("the prompt encodes to zero tokens")
        V = self.target.config.vocab_size
        if max(ids) >= V:
            raise ConfigError(f"the prompt encodes to token id {max(ids)}, outside the target's vocabulary of {V} "
                              "(its tokenizer and checkpoint do not match)")
        return ids
