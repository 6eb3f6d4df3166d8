"""Whether this machine has the memory to load a deployment on the CPU, checked before loading.

A deployment's models are loaded whole, in the load dtype (float32 on a CPU), widened by their
expansion factors at load time, so what one load needs is known from the checkpoints' configs
before a byte is read (`weight_bytes`): the target and the draft model widened
(`models.expand.ModelSize`, exact up to the rope tables), and a DFlash or EAGLE-3 head counted as
a decoder of its layer config widened likewise (an embedding and lm_head of its own included: an
estimate on the high side, as most heads share the target's); a target with an FP8
`target_format` is loaded in float32 and its codes made beside it (one byte a weight more). Each
process that holds the models needs that plus `PROCESS_BYTES` (torch itself, activations, a short
run's KV cache).

The rule (`check_memory`), with E = copies x (weights + PROCESS_BYTES) and A = MemAvailable from
/proc/meminfo (what the kernel can hand out without swapping):

    E > A               refuse: a one-line `ConfigError` (exit 2) saying what the load needs and
                        what is free, before anything is loaded;
    E > WARN_SHARE x A  a `Notice` (one `note:` line): it fits, but leaves the rest of the machine
                        little, and a run that grows past the estimate may swap or be killed;
    else                nothing.

`SPECPILOT_MEMORY_CHECK=0` turns the refusal into the notice (the estimate is an estimate). Only
CPU loads are checked — on a GPU the weights live in device memory — and nothing is checked where
/proc/meminfo is missing (not Linux) or a checkpoint's config cannot be read (the load then says
what is wrong with it).

Owns: the estimate and the rule. Does not own loading (`session.py`) or how many processes a
command runs (its caller says: `copies`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from specpilot import env
from specpilot.config import Deployment, TargetFormat
from specpilot.errors import CheckpointError, ConfigError, Notice

PROCESS_BYTES = 500_000_000  # per process beyond the weights (a loaded fixture process: ~0.5 GB more than them)
WARN_SHARE = 0.7  # above this share of the available memory: a note
MEMINFO = Path("/proc/meminfo")
GB = 1e9


def available_bytes(meminfo: Path = MEMINFO) -> int | None:
    """MemAvailable in bytes, or None where the file or the field is missing."""
    try:
        for line in meminfo.read_text().splitlines():
            name, _, value = line.partition(":")
            if name == "MemAvailable":
                return int(value.split()[0]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def weight_bytes(deployment: Deployment, dtype: torch.dtype) -> int:
    """Bytes of one loaded copy of `deployment`'s models in `dtype` (see the module docstring)."""
    from specpilot.engine.session import resolve_model_dir
    from specpilot.models.config import ModelConfig
    from specpilot.models.dflash_checkpoint import is_dflash_dir, read_dflash_config
    from specpilot.models.eagle3_checkpoint import is_eagle3_dir, read_eagle3_config
    from specpilot.models.expand import ModelSize, expanded_config

    target = ModelConfig.from_dir(resolve_model_dir(deployment.target, "target"))

    def layers(path: Path) -> ModelConfig:  # a draft model's config, or a head's layer config
        if is_dflash_dir(path):
            return read_dflash_config(path)[0]
        if is_eagle3_dir(path):
            return read_eagle3_config(path, target.num_layers)[0]
        return ModelConfig.from_dir(path)

    parts = [(target, deployment.target_expand)]
    if deployment.drafter not in ("ngram", "none"):
        parts.append((layers(resolve_model_dir(deployment.drafter, "drafter")), deployment.drafter_expand))
    for kind in ("dflash", "eagle3"):  # heads loaded beside the drafter, at the target's width
        if getattr(deployment, kind):
            parts.append((layers(resolve_model_dir(getattr(deployment, kind), f"{kind} drafter")),
                          deployment.target_expand))
    total = sum(ModelSize.of(expanded_config(config, factor)).bytes(dtype) for config, factor in parts)
    if deployment.target_experts:  # the upcycled copy is built beside the dense target
        from specpilot.config import parse_experts
        from specpilot.models.upcycle import upcycled_config

        wide = expanded_config(target, deployment.target_expand)
        experts = parse_experts(deployment.target_experts, deployment.name)
        total += ModelSize.of(upcycled_config(wide, *experts)).bytes(dtype)
    if deployment.target_format is not TargetFormat.STORED:  # loaded in float32, its FP8 codes made beside it
        size = ModelSize.of(expanded_config(target, deployment.target_expand))
        total += size.bytes(torch.float32) - size.bytes(dtype) + size.params
    return total


@dataclass(frozen=True)
class LoadEstimate:
    """What `copies` processes holding a deployment need, against what the machine has free."""

    weights: int  # bytes of one copy of the models
    copies: int
    available: int
    dtype: torch.dtype

    @property
    def needed(self) -> int:
        return self.copies * (self.weights + PROCESS_BYTES)

    def describe(self, name: str, who: str) -> str:
        weights = f"{self.weights / GB:.1f} GB of {str(self.dtype).removeprefix('torch.')} weights"
        if self.copies == 1:
            how = f"{weights} + {PROCESS_BYTES / GB:.1f} GB for the process"
        else:
            how = (f"{self.copies} x {(self.weights + PROCESS_BYTES) / GB:.1f} GB: {who}, each holding {weights} + "
                   f"{PROCESS_BYTES / GB:.1f} GB of its own")
        return f"loading {name} on the CPU needs about {self.needed / GB:.1f} GB of memory ({how})"


def check_memory(deployment: Deployment, device: str | torch.device | None = None, copies: int = 1,
                 who: str = "") -> LoadEstimate | None:
    """Refuse (`ConfigError`) or note (`Notice`) a load of `deployment` on `device` (None: the
    default) by `copies` processes at once (`who` names them), by the module docstring's rule,
    before anything is loaded; returns the estimate, or None when nothing was checked."""
    device = torch.device(device) if device is not None else env.default_device()
    if device.type != "cpu":
        return None
    available = available_bytes()
    if available is None:
        return None
    dtype = env.default_dtype(device)
    try:
        estimate = LoadEstimate(weight_bytes(deployment, dtype), copies, available, dtype)
    except CheckpointError:
        return None  # the load itself reports what is wrong with the checkpoint
    line, free = estimate.describe(deployment.name, who), f"{available / GB:.1f} GB"
    if estimate.needed > available and env.memory_check():
        raise ConfigError(f"{line}; only {free} is available (MemAvailable): use a smaller deployment, a GPU, "
                          "or free memory (SPECPILOT_MEMORY_CHECK=0 loads anyway)")
    if estimate.needed > WARN_SHARE * available:
        warnings.warn(f"{line}, {estimate.needed / available:.0%} of the {free} available (MemAvailable): the "
                      "machine may swap, or the run be killed, if it grows past the estimate", Notice, stacklevel=2)
    return estimate
