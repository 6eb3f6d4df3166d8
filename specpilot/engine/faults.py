"""Deliberate faults the engine can inject, to test the token-forcing guard.

- `logit-bias:VALUE:every=K:after=T`: add VALUE to the target logits of every K-th vocabulary id
  (ids 0, K, 2K, ...) when predicting generated token T+1 onwards (the article: 2, 7, 2048).
- `accept-unverified`: the deepest draft node is accepted without being checked (see
  `specpilot.engine.verify`): the classic speculative-decoding reward hack.
- `delay:MS`: sleep MS milliseconds on the host each time the target's logits are read (once per
  decoding round): lossless but slow, the deliberate slowdown a coding agent's patch removes in
  the loop's tests (`tests/loop/test_coding_e2e.py`). Eager only: a CUDA graph replays no sleep.

A fault makes the engine lossy or slow on purpose; nothing enables one unless asked by name.
"""

from __future__ import annotations

import enum
import re
import time
from dataclasses import dataclass

import torch

from specpilot.errors import ConfigError


class FaultKind(enum.Enum):
    LOGIT_BIAS = "logit-bias"
    ACCEPT_UNVERIFIED = "accept-unverified"
    DELAY = "delay"


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    value: float = 0.0
    every: int = 1
    after: int = 0

    def spec(self) -> str:
        if self.kind is FaultKind.LOGIT_BIAS:
            return f"logit-bias:{self.value:g}:every={self.every}:after={self.after}"
        if self.kind is FaultKind.DELAY:
            return f"delay:{self.value:g}"
        return self.kind.value


_BIAS = re.compile(r"^logit-bias:(?P<value>[-+0-9.eE]+):every=(?P<every>\d+):after=(?P<after>\d+)$")
_DELAY = re.compile(r"^delay:(?P<ms>[0-9.]+)$")


def parse_fault(spec: str | None) -> Fault | None:
    """Parse a `--fault` string; None or '' means no fault."""
    if not spec:
        return None
    if spec == FaultKind.ACCEPT_UNVERIFIED.value:
        return Fault(FaultKind.ACCEPT_UNVERIFIED)
    if m := _DELAY.match(spec):
        try:
            return Fault(FaultKind.DELAY, float(m["ms"]))
        except ValueError:
            raise ConfigError(f"fault {spec!r}: MS is not a number") from None
    m = _BIAS.match(spec)
    if not m:
        raise ConfigError(
            f"unknown fault {spec!r} (expected 'logit-bias:VALUE:every=K:after=T', 'accept-unverified' or 'delay:MS')"
        )
    try:
        value = float(m["value"])
    except ValueError:
        raise ConfigError(f"fault {spec!r}: VALUE is not a number") from None
    every = int(m["every"])
    if every < 1:
        raise ConfigError(f"fault {spec!r}: every must be >= 1")
    return Fault(FaultKind.LOGIT_BIAS, value, every, int(m["after"]))


def apply_logit_bias(fault: Fault | None, logits: torch.Tensor, generated_index: torch.Tensor) -> torch.Tensor:
    """logits [B,T,V]; generated_index [B,T] = 0-based index of the token each row predicts. Also
    where the `delay` fault sleeps (the logits unchanged)."""
    if fault is not None and fault.kind is FaultKind.DELAY:
        time.sleep(fault.value / 1e3)
        return logits
    if fault is None or fault.kind is not FaultKind.LOGIT_BIAS:
        return logits
    V = logits.shape[-1]
    bias = torch.zeros(V, device=logits.device, dtype=logits.dtype)
    bias[:: fault.every] = fault.value
    on = (generated_index >= fault.after)[..., None].to(logits.dtype)  # [B,T,1]
    return logits + on * bias
