"""Deliberate faults the engine can inject, to test the token-forcing guard.

- `logit-bias:VALUE:every=K:after=T`: add VALUE to the target logits of every K-th vocabulary id
  (ids 0, K, 2K, ...) when predicting generated token T+1 onwards (the article: 2, 7, 2048).
- `accept-unverified`: the deepest draft node is accepted without being checked (see
  `specpilot.engine.verify`): the classic speculative-decoding reward hack.
- Under sampling (`sampled_steps.py`; inert in greedy rounds): `sampling-rule:RULE` verifies
  by a broken acceptance rule (`acceptance_sampling.SamplingFault`: `correction-from-p`,
  `residual-unnormalised`); `target-temperature:T` processes the target's logits at temperature
  T instead of the request's (a drafter's temperature applied to the target); `target-top-p:P`
  processes them with top-p P (1: top-p left off the target's side).
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
    SAMPLING_RULE = "sampling-rule"
    TARGET_TEMPERATURE = "target-temperature"
    TARGET_TOP_P = "target-top-p"


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    value: float = 0.0
    every: int = 1
    after: int = 0
    rule: str = ""  # SAMPLING_RULE: an `acceptance_sampling.SamplingFault` value

    @property
    def sampling(self) -> bool:
        """A fault of sampled rounds only."""
        return self.kind in (FaultKind.SAMPLING_RULE, FaultKind.TARGET_TEMPERATURE, FaultKind.TARGET_TOP_P)

    def spec(self) -> str:
        if self.kind is FaultKind.LOGIT_BIAS:
            return f"logit-bias:{self.value:g}:every={self.every}:after={self.after}"
        if self.kind is FaultKind.DELAY:
            return f"delay:{self.value:g}"
        if self.kind is FaultKind.SAMPLING_RULE:
            return f"sampling-rule:{self.rule}"
        if self.kind in (FaultKind.TARGET_TEMPERATURE, FaultKind.TARGET_TOP_P):
            return f"{self.kind.value}:{self.value:g}"
        return self.kind.value


_BIAS = re.compile(r"^logit-bias:(?P<value>[-+0-9.eE]+):every=(?P<every>\d+):after=(?P<after>\d+)$")
_DELAY = re.compile(r"^delay:(?P<ms>[0-9.]+)$")
_RULES = ("correction-from-p", "residual-unnormalised")  # `acceptance_sampling.SamplingFault` values
_TARGET = re.compile(r"^(?P<kind>target-temperature|target-top-p):(?P<value>[0-9.eE+-]+)$")


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
    if spec.startswith(FaultKind.SAMPLING_RULE.value + ":"):
        rule = spec.split(":", 1)[1]
        if rule not in _RULES:
            raise ConfigError(f"fault {spec!r}: the rule must be one of {', '.join(_RULES)}")
        return Fault(FaultKind.SAMPLING_RULE, rule=rule)
    if m := _TARGET.match(spec):
        return _target_fault(spec, FaultKind(m["kind"]), m["value"])
    m = _BIAS.match(spec)
    if not m:
        raise ConfigError(
            f"unknown fault {spec!r} (expected 'logit-bias:VALUE:every=K:after=T', 'accept-unverified', 'delay:MS', "
            "'sampling-rule:RULE', 'target-temperature:T' or 'target-top-p:P')"
        )
    try:
        value = float(m["value"])
    except ValueError:
        raise ConfigError(f"fault {spec!r}: VALUE is not a number") from None
    every = int(m["every"])
    if every < 1:
        raise ConfigError(f"fault {spec!r}: every must be >= 1")
    return Fault(FaultKind.LOGIT_BIAS, value, every, int(m["after"]))


def _target_fault(spec: str, kind: FaultKind, text: str) -> Fault:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"fault {spec!r}: {text!r} is not a number") from None
    if kind is FaultKind.TARGET_TEMPERATURE and not value > 0:
        raise ConfigError(f"fault {spec!r}: the temperature must be > 0")
    if kind is FaultKind.TARGET_TOP_P and not 0 < value <= 1:
        raise ConfigError(f"fault {spec!r}: top-p must be in (0, 1]")
    return Fault(kind, value)


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
