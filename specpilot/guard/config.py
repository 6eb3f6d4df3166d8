"""`GuardConfig`: the thresholds of the token-forcing guard, and the near-tie threshold per dtype.

Owns: every number the decision uses (the rate margin, the confidence level, the near-tie
threshold, the bootstrap's resamples and seed, the forcing chunk) and the two modes as enums:
how candidate and stock sequences are paired (`Pairing`) and which hypothesis the rate test
tests (`RateTest`). The CLI maps its flags 1:1 onto these fields.

Does not own forcing (`forcing.py`), the bootstrap (`statistics.py`) or the decision (`verdict.py`).

Near-ties. A mismatch at a forced position is a *near-tie* when its margin (scorer's top logit
minus the emitted token's logit, which equals the log-prob difference in nats because the softmax
normaliser cancels) is at most `near_tie_nats`; otherwise it is *large-margin*, i.e. not explained
by kernel rounding. The threshold must bound what rounding can do, not describe what it usually
does: the large-margin rule tolerates no excess over stock, so a threshold below the rounding
envelope would reject lossless systems on noise. Defaults (`default_near_tie_nats`):

- bfloat16: 0.5 nats. The article measured at most 0.232 nats between the two tokens at every
  first divergence of lossless bf16 systems (27B target, GPU); 0.5 gives ~2x headroom and is
  4 bf16 ulps at |logit| in [16, 32), the usual range of an LLM's top logit.
- float16: 0.0625 nats, the bf16 value scaled by the 3 extra mantissa bits (2^-3).
- float32: 1e-3 nats. Storage rounding is negligible in float32; what remains is accumulation
  order. Chunked vs token-by-token forwards of the test checkpoints on CPU differ by <= 1e-5 in
  any logit (measured: 7.6e-6), so 1e-3 keeps 100x headroom and stays far below any fault's
  margin. This assumes full-precision float32 matmuls (PyTorch's default); with TF32 enabled
  the products carry 10 mantissa bits, so use the float16 value.

The rate rule counts every mismatch, near-tie or not, so a generous threshold costs little: it
only moves a fault's small-margin mismatches from the large-margin count to the near-tie count.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass

import torch

from specpilot.errors import ConfigError

_NEAR_TIE_NATS = {torch.bfloat16: 0.5, torch.float16: 0.0625, torch.float32: 1e-3}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_near_tie_nats(dtype: torch.dtype) -> float:
    """The default near-tie threshold (nats) for a scorer running in `dtype` (see module doc)."""
    if dtype not in _NEAR_TIE_NATS:
        raise ConfigError(f"no default near-tie threshold for dtype {dtype}; set near_tie_nats explicitly")
    return _NEAR_TIE_NATS[dtype]


class Pairing(enum.Enum):
    """How candidate and stock sequences are resampled."""

    REQUIRED = "required"  # same prompts (any order): paired bootstrap; different prompts are an error
    AUTO = "auto"  # paired when the prompt lists match, otherwise independent resampling
    INDEPENDENT = "independent"  # always resample candidate and stock sequences independently


class RateTest(enum.Enum):
    """Which null hypothesis the rate test tests; D = rate(candidate) - rate(stock)."""

    # H0: D <= rate_margin. Reject the candidate when the one-sided lower confidence bound of D is
    # above it. False rejections of systems within the margin are <= 1 - confidence at any size.
    EXCESS = "excess"
    # H0: D >= rate_margin (non-inferiority). Pass only when the one-sided upper bound of D is below
    # it: the candidate must show it is within the margin, so small samples fail.
    NON_INFERIORITY = "non-inferiority"


@dataclass(frozen=True)
class GuardConfig:
    rate_margin: float = 0.005  # allowed excess mismatch rate over stock (0.005 = 0.5 percentage points)
    confidence: float = 0.95  # one-sided confidence of the rate bound
    near_tie_nats: float | None = None  # None: default_near_tie_nats(scorer dtype)
    large_margin_allowance: int = 0  # large-margin mismatches the candidate may have beyond stock's
    resamples: int = 10_000  # bootstrap resamples
    seed: int = 0  # bootstrap seed (verdicts are deterministic)
    chunk: int = 512  # tokens per teacher-forced forward
    pairing: Pairing = Pairing.REQUIRED
    rate_test: RateTest = RateTest.EXCESS
    min_sequences: int = 20  # below this the percentile bootstrap is optimistic; the verdict warns

    def __post_init__(self):
        if not 0.0 <= self.rate_margin < 1.0:
            raise ConfigError(f"guard rate_margin must be in [0, 1) as a fraction of tokens (got {self.rate_margin})")
        if not 0.5 < self.confidence < 1.0:
            raise ConfigError(f"guard confidence must be in (0.5, 1) (got {self.confidence})")
        if self.near_tie_nats is not None and self.near_tie_nats < 0:
            raise ConfigError(f"near_tie_nats must be >= 0 (got {self.near_tie_nats})")
        if self.large_margin_allowance < 0:
            raise ConfigError("large_margin_allowance must be >= 0")
        if self.resamples < 100:
            raise ConfigError(f"bootstrap resamples must be >= 100 (got {self.resamples})")
        if self.chunk < 1:
            raise ConfigError(f"forcing chunk must be >= 1 (got {self.chunk})")
        if self.min_sequences < 1:
            raise ConfigError("min_sequences must be >= 1")

    def near_tie_for(self, dtype: torch.dtype) -> float:
        """The near-tie threshold in nats for a scorer running in `dtype`."""
        return self.near_tie_nats if self.near_tie_nats is not None else default_near_tie_nats(dtype)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["pairing"], d["rate_test"] = self.pairing.value, self.rate_test.value
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "GuardConfig":
        d = dict(d)
        try:
            if "pairing" in d:
                d["pairing"] = Pairing(d["pairing"])
            if "rate_test" in d:
                d["rate_test"] = RateTest(d["rate_test"])
            return cls(**d)
        except (ValueError, TypeError) as err:
            raise ConfigError(f"guard config: {err}") from None
